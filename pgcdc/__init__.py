"""pgcdc: PostgreSQL change data capture into Kafka, with Spark followers.

``pgcdc.core`` is the shared kernel that the reader (``cdc``), the event format
(``schemas``), the followers (``sinks``) and the jobs (``spark_jobs``) import; it imports
none of them. ``pgcdc.stack`` runs the local servers (standard library only).
"""

__version__ = "0.1.0"
