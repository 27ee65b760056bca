"""What the model is asked: task data, SQuAD features and answers, metrics, the bundled demo tasks."""
