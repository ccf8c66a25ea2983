"""Spark Structured Streaming jobs that keep the followers in sync with the CDC topics."""
