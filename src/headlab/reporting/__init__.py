"""What runs leave behind: typed results records; statistics, tables and plots as they arrive."""
