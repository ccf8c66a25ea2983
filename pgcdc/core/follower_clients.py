"""Client options for the followers' servers from the ``redis`` and ``search`` settings.

Keyword arguments for ``redis.Redis.from_url`` and ``opensearchpy.OpenSearch``: TLS files,
certificate checks and basic auth. Credentials in the URLs work as well and need nothing
here (``rediss://user:password@host:port/0``, ``https://user:password@host:9200``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgcdc.core.errors import ConfigError

if TYPE_CHECKING:
    from pgcdc.core.settings import RedisSettings, SearchSettings


def _file(setting: str, path: str | None) -> str | None:
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"{setting} {path} is not a readable file")
    return path


def redis_options(redis: RedisSettings) -> dict[str, Any]:
    """``from_url`` keyword arguments: the CA and the client certificate of a rediss URL."""
    files = {
        "ssl_ca_certs": _file("redis.ssl_ca_location", redis.ssl_ca_location),
        "ssl_certfile": _file("redis.ssl_certificate_location", redis.ssl_certificate_location),
        "ssl_keyfile": _file("redis.ssl_key_location", redis.ssl_key_location),
    }
    return {k: v for k, v in files.items() if v is not None}


_TRUE = ("1", "true", "yes", "on")


def redis_cluster_url(url: str) -> tuple[str, bool]:
    """``(url, cluster)``: the URL without a ``cluster=`` query parameter (which
    ``redis.Redis.from_url`` would not accept), and whether it asked for a Redis Cluster."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    flags = [v for k, v in query if k == "cluster"]
    if not flags:
        return url, False
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    return urlunsplit(parts._replace(query=rest)), flags[-1].lower() in _TRUE


def opensearch_options(search: SearchSettings) -> dict[str, Any]:
    """``OpenSearch(...)`` keyword arguments: basic auth, the CA, certificate checks, mTLS."""
    out: dict[str, Any] = {}
    if search.username is not None and search.password is not None:
        out["http_auth"] = (search.username, search.password.get_secret_value())
    files = {
        "ca_certs": _file("search.ssl_ca_location", search.ssl_ca_location),
        "client_cert": _file("search.ssl_certificate_location", search.ssl_certificate_location),
        "client_key": _file("search.ssl_key_location", search.ssl_key_location),
    }
    out |= {k: v for k, v in files.items() if v is not None}
    if not search.verify_certs:
        out["verify_certs"] = False
        out["ssl_show_warn"] = False  # the setting was a choice; one warning per request is noise
    return out
