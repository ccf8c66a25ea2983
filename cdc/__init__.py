"""PostgreSQL change data capture: pgoutput logical replication into Kafka."""

__version__ = "0.1.0"
