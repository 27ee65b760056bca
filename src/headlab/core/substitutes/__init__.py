"""What substituted heads take (``mean``, ``resample``): means over a reference set and resample sources."""
