"""The event format: Debezium-compatible envelopes, Connect JSON and Avro, with no I/O."""
