"""PostgreSQL change data capture: pgoutput logical replication into Kafka."""

from pgcdc import __version__

__all__ = ["__version__"]
