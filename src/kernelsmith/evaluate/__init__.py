"""Evaluation: build, validate and time candidates in isolated worker processes."""
