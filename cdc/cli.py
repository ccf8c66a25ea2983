"""The ``cdc`` command line: run the reader, show its status, snapshot tables, reset its state.

Every error the reader raises on purpose ends as one line ``error: ...`` on stderr and a
non-zero exit status; ``--debug`` shows the traceback too. Whatever reaches the terminal (the
error line, log lines, tracebacks) is scrubbed of the settings' secrets (passwords in the
DSN and the followers' URLs, Kafka SASL passwords), in case a library quotes one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from cdc.connection import MIN_SCRUBBED_CHARS, scrub, secrets_of
from cdc.interrupt import Interrupt
from pgcdc import __version__
from pgcdc.core import kafka_config
from pgcdc.core.errors import CdcError, ConfigError
from pgcdc.core.logs import configure_logging
from pgcdc.core.qualified_names import split_qualified
from pgcdc.core.settings import Settings, SnapshotMode, load_settings

if TYPE_CHECKING:
    from pgcdc.core.verify_record import VerifyPass
    from pgcdc.verify.run import TableResult

log = logging.getLogger("cdc")
T = TypeVar("T")

# The loaded settings' secrets, scrubbed from every line this process prints.
_SECRETS: list[str] = []

app = typer.Typer(
    help="PostgreSQL change data capture into Kafka (Debezium-compatible events).",
    pretty_exceptions_enable=False,
    add_completion=False,
    no_args_is_help=True,
)

ConfigOpt = Annotated[
    str | None, typer.Option("--config", help="TOML config file (also CDC_CONFIG).")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Verbose logs and tracebacks.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
TablesArg = Annotated[
    list[str] | None,
    typer.Argument(help="schema.table names (a bare name: the captured table of that name)."),
]
LogJsonOpt = Annotated[
    bool, typer.Option("--log-json", help="Log one JSON object per line (also CDC_LOG_JSON).")
]


def _setup_logging(settings: Settings, debug: bool, level: str | None = None) -> None:
    """Logs on stderr with their structured fields (slot, lsn, table, topic), text or JSON.

    ``level`` overrides the configured level (a command whose output is on stdout keeps its
    logs quiet); ``debug`` shows everything.
    """
    configure_logging(
        logging.DEBUG if debug else (level or settings.log_level), json_logs=settings.log_json
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_ScrubbingFormatter(handler.formatter or logging.Formatter()))
    # librdkafka reports every failed connection attempt; that is noise unless debugging.
    logging.getLogger("cdc.librdkafka").setLevel(logging.DEBUG if debug else logging.CRITICAL)


class _ScrubbingFormatter(logging.Formatter):
    """Formats with ``inner``, then scrubs the secrets (message, fields and traceback)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return scrub(self._inner.format(record), _SECRETS)


def _secrets(settings: Settings) -> list[str]:
    """Every secret the settings hold, as it could appear in text."""
    from urllib.parse import unquote, urlsplit

    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    dsn = settings.postgres.dsn.get_secret_value()
    out = [dsn]
    # Unparseable: the run stops with a line that quotes none of it.
    with contextlib.suppress(psycopg.ProgrammingError):
        out += secrets_of(conninfo_to_dict(dsn))
    for url in (settings.redis.url, settings.search.url):
        text = url.get_secret_value()
        out.append(text)
        try:
            password = urlsplit(text).password
        except ValueError:
            password = None
        if password:
            out += [password, unquote(password)]
    out += kafka_config.secret_values(settings.kafka)
    if settings.search.password is not None:
        out.append(settings.search.password.get_secret_value())
    if settings.postgres.signal_secret is not None:
        out.append(settings.postgres.signal_secret.get_secret_value())
    return [s for s in out if len(s) >= MIN_SCRUBBED_CHARS]


def _log_overrides(log_json: bool) -> dict[str, Any]:
    return {"log_json": True} if log_json else {}


def _guard(debug: bool, fn: Callable[[], T]) -> T:
    """Run ``fn``; turn errors into one clear line and a non-zero exit."""
    try:
        return fn()
    except CdcError as e:
        if debug:
            log.exception("failed")
        typer.echo(scrub(f"error: {e}", _SECRETS), err=True)
        raise typer.Exit(2 if isinstance(e, ConfigError) else 1) from None
    except Exception as e:
        if debug:
            log.exception("unexpected failure")
        typer.echo(scrub(f"error: unexpected {type(e).__name__}: {e}", _SECRETS), err=True)
        raise typer.Exit(1) from None


def _json_guard(debug: bool, fn: Callable[[], T], failed: Callable[[str], dict[str, Any]]) -> T:
    """Run ``fn`` for a ``--json`` command. Even when it fails a machine gets JSON:
    ``failed(line)`` on stdout, the one line on stderr, and the exit status says which kind
    (2 settings, 1 anything else)."""
    try:
        return fn()
    except Exception as e:
        if debug:
            log.exception("failed")
        line = str(e) if isinstance(e, CdcError) else f"unexpected {type(e).__name__}: {e}"
        typer.echo(scrub(json.dumps(failed(line)), _SECRETS))
        typer.echo(scrub(f"error: {line}", _SECRETS), err=True)
        raise typer.Exit(2 if isinstance(e, ConfigError) else 1) from None


def _settings(
    config: str | None, overrides: dict[str, Any], flag_names: dict[str, str] | None = None
) -> Settings:
    """The settings, or a ConfigError naming every problem and where each came from."""
    settings = load_settings(config, overrides, flag_names=flag_names)
    _SECRETS[:] = _secrets(settings)
    return settings


# Libraries that log a warning (with a traceback) for each failed request: their errors reach
# the user as our own one line instead, unless --debug.
_NOISY_LIBRARIES = ("opensearch", "urllib3", "elastic_transport", "redis")


def _quiet_libraries(debug: bool) -> None:
    # Python warnings too (urllib3's InsecureRequestWarning with search.verify_certs = false):
    # they go through logging, shown with --debug only.
    logging.captureWarnings(True)
    for name in (*_NOISY_LIBRARIES, "py.warnings"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.CRITICAL)


@app.command()
def run(
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="'current': stop once everything up to the WAL position at start is in Kafka.",
        ),
    ] = None,
    config: ConfigOpt = None,
    snapshot_mode: Annotated[
        SnapshotMode | None,
        typer.Option("--snapshot-mode", help="initial | no_data | initial_only | when_needed"),
    ] = None,
    tables: Annotated[
        str | None, typer.Option("--tables", help="Comma-separated schema.table include list.")
    ] = None,
    slot: Annotated[str | None, typer.Option("--slot", help="Replication slot name.")] = None,
    publication: Annotated[
        str | None, typer.Option("--publication", help="Publication name.")
    ] = None,
    topic_prefix: Annotated[
        str | None, typer.Option("--topic-prefix", help="Kafka topic prefix.")
    ] = None,
    drop_slot_on_exit: Annotated[
        bool, typer.Option("--drop-slot-on-exit", help="Drop the slot (and state) when done.")
    ] = False,
    adopt_slot: Annotated[
        bool, typer.Option("--adopt-slot", help="Take over a slot this reader did not create.")
    ] = False,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics here.")
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(
            "--health-port",
            help="Serve /healthz (alive) and /readyz (streaming, acknowledged within "
            "health_ready_s seconds; 503 otherwise) here.",
        ),
    ] = None,
    debug: DebugOpt = False,
    log_json: LogJsonOpt = False,
) -> None:
    """Snapshot if needed, then stream changes to Kafka until stopped (SIGTERM/SIGINT)."""
    flags = {
        "postgres.snapshot_mode": ("--snapshot-mode", snapshot_mode),
        "postgres.tables": ("--tables", tables),
        "postgres.slot_name": ("--slot", slot),
        "postgres.publication_name": ("--publication", publication),
        "postgres.drop_slot_on_exit": ("--drop-slot-on-exit", True if drop_slot_on_exit else None),
        "postgres.adopt_slot": ("--adopt-slot", True if adopt_slot else None),
        "kafka.topic_prefix": ("--topic-prefix", topic_prefix),
        "metrics_port": ("--metrics-port", metrics_port),
        "health_port": ("--health-port", health_port),
        "log_json": ("--log-json", True if log_json else None),
    }
    overrides: dict[str, Any] = {}
    for name, (_flag, value) in flags.items():
        if value is not None:
            *sections, leaf = name.split(".")
            node = overrides
            for section in sections:
                node = node.setdefault(section, {})
            node[leaf] = value
    flag_names = {name: flag for name, (flag, _value) in flags.items()}

    def go() -> None:
        if until not in (None, "current"):
            raise ConfigError(f"--until accepts only 'current', not {until!r}")
        interrupt = Interrupt()
        interrupt.install()  # from here Ctrl-C stops the run (cdc.interrupt)
        settings = _settings(config, overrides, flag_names)
        _setup_logging(settings, debug)
        from cdc.metrics import ReaderMetrics
        from cdc.pipeline import Pipeline

        metrics: ReaderMetrics | None = None
        health = None
        if settings.health_port:
            from cdc.health import ReaderHealth
            from pgcdc.core.health import HealthServer

            tracker = ReaderHealth(settings.health_ready_s)
            metrics = tracker
            health = HealthServer(tracker.ready, settings.health_port, settings.health_host)
            health.start()
        if settings.metrics_port:
            metrics = metrics or ReaderMetrics()
            metrics.serve(settings.metrics_port)
        from cdc.pipeline import RunResult
        from cdc.supervise import run_supervised

        try:
            with interrupt.armed():
                result = run_supervised(
                    lambda: Pipeline(
                        settings,
                        until_current=until == "current",
                        interrupt=interrupt,
                        metrics=metrics,
                    ),
                    stop=interrupt.stop,
                    reconnect_timeout_s=settings.postgres.reconnect_timeout_s,
                    snapshot_retries=settings.postgres.snapshot_retries,
                    on_stopped=lambda: RunResult("stopped"),
                )
        except KeyboardInterrupt:
            # Stopped while starting (connecting, waiting for a slot, creating it): as safe
            # as a crash; the next run starts from what the slot and the state say.
            log.info("stopped; the next run starts from what the slot and the state say")
            result = RunResult("stopped")
        finally:
            if health is not None:
                health.close()
        log.info(
            "done: %s, %d snapshot rows, %d change events, acked %s",
            result.action,
            result.snapshot_rows,
            result.events,
            result.acked_lsn,
            extra={"slot": settings.postgres.slot_name, "lsn": str(result.acked_lsn)},
        )

    _guard(debug, go)


UNHEALTHY_EXIT = 3


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cdc (pgcdc) {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """PostgreSQL change data capture into Kafka (Debezium-compatible events)."""


STATUS_HELP = (
    "Show the slot (active, wal_status, confirmed flush LSN, lag in bytes and seconds, "
    "retained WAL), the topics and each follower's watermark, its age (how long ago it last "
    "advanced) and lag, and the last pass of cdc verify (when; clean, or what drifted)."
    "\n\nLag in seconds is the server's pg_stat_replication.replay_lag for the reader's "
    "connection (0 when caught up, empty when no reader is connected)."
    "\n\nA server that cannot be read (PostgreSQL, Kafka, Redis, OpenSearch) is shown with "
    "its reason, and the rest is still shown. With --json one JSON document is printed "
    "whatever happens (warnings on stderr)."
    "\n\nExit status: 0 healthy; 3 unhealthy (a server cannot be read, the slot is missing "
    "or lost, or inactive while retaining more WAL than postgres.retained_wal_warn_bytes, "
    "a follower's store cannot be read, or a follower's watermark has not advanced for more "
    "than spark.watermark_stale_s while the reader acknowledged changes past it, or the last "
    "pass of cdc verify found drift); 2 when the settings are wrong (or a server refuses "
    "them: a login, a certificate); 1 on an unexpected failure. A server's error is also "
    "one line on stderr."
)


@app.command(help=STATUS_HELP)
def status(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
    log_json: LogJsonOpt = False,
) -> None:
    """What ``STATUS_HELP`` says."""

    def go() -> dict[str, Any]:
        settings = _settings(config, _log_overrides(log_json))
        _setup_logging(settings, debug, level="WARNING")
        _quiet_libraries(debug)
        from cdc.status import gather_status

        # The entry point composes the sections: the reader's package knows nothing of the
        # followers, so their section is wired in here.
        from sinks.status import status_hook

        return gather_status(settings, sections={"followers": status_hook})

    def outcome(found: dict[str, Any]) -> None:
        """Each server's error as one line on stderr; the exit status."""
        for line in (found.get("errors") or {}).values():
            typer.echo(scrub(f"error: {line}", _SECRETS), err=True)
        if found.get("settings_wrong"):
            raise typer.Exit(2)
        if not found["healthy"]:
            raise typer.Exit(UNHEALTHY_EXIT)

    if not as_json:
        found = _guard(debug, go)
        from cdc.status_view import render_text

        typer.echo(scrub(render_text(found), _SECRETS), nl=False)
        outcome(found)
        return
    found = _json_guard(
        debug, go, lambda line: {"healthy": False, "error": line, "problems": [line]}
    )
    typer.echo(scrub(json.dumps(found, indent=2), _SECRETS))
    for warning in found["warnings"]:
        typer.echo(scrub(f"warning: {warning}", _SECRETS), err=True)
    outcome(found)


@app.command("reset-state")
def reset_state(
    config: ConfigOpt = None,
    drop_slot: Annotated[
        bool, typer.Option("--drop-slot", help="Also drop the replication slot.")
    ] = False,
    debug: DebugOpt = False,
    log_json: LogJsonOpt = False,
) -> None:
    """Forget the reader's state for this slot, so the next run takes a new snapshot."""

    def go() -> None:
        settings = _settings(config, _log_overrides(log_json))
        _setup_logging(settings, debug, level="INFO")
        from cdc.connection import connect, current_database
        from cdc.slots import drop_slot as drop
        from cdc.state import StateStore

        with connect(settings.postgres.dsn.get_secret_value()) as conn:
            database = current_database(conn)
            if drop_slot:
                drop(conn, settings.postgres.slot_name)
        StateStore(settings.kafka, settings.kafka.topic_prefix).reset(
            database, settings.postgres.slot_name, keep_slot=not drop_slot
        )
        typer.echo(f"state of slot {settings.postgres.slot_name} reset")

    _guard(debug, go)


FORGET_HELP = (
    "Remove a table that left the captured set from its topic and both followers."
    "\n\nA tombstone for every key its topic holds; the sync jobs delete their copies as "
    "they apply them. A table still captured is refused."
)


@app.command(help=FORGET_HELP)
def forget(
    table: Annotated[str, typer.Argument(help="schema.table, no longer captured.")],
    config: ConfigOpt = None,
    debug: DebugOpt = False,
) -> None:

    def go() -> None:
        settings = _settings(config, {})
        _setup_logging(settings, debug, level="INFO")
        from cdc.forget import forget as forget_table

        try:
            schema, name = split_qualified(table)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        count = forget_table(settings, schema, name)
        typer.echo(f"{table}: {count} keys tombstoned; the followers delete their copies")

    _guard(debug, go)


SNAPSHOT_HELP = (
    "Ask the running (or next) reader to snapshot TABLES incrementally, while it streams: "
    "each table is read in key-ordered chunks between watermarks, its rows published as "
    'op "r" (source.snapshot = incremental), and a streamed change always wins over a '
    "chunk row. The request is checked first (each table exists and is captured, --where "
    "is one boolean expression over its columns), then written into the WAL as a signed "
    "logical message (Debezium's execute-snapshot signal; the key is postgres.signal_secret, "
    "or derived from the password in postgres.dsn), so a reader that is down runs it when it "
    "comes back."
    "\n\n--where adds a condition (ANDed) to every table's chunks; --stop cancels "
    "the snapshots of TABLES (of every table when none is given). Progress shows in the "
    "reader's log (a bar on a terminal), in `cdc status` and in its metrics."
)


@app.command(help=SNAPSHOT_HELP)
def snapshot(
    tables: TablesArg = None,
    where: Annotated[
        str | None,
        typer.Option("--where", help="A boolean expression over the table's columns, ANDed."),
    ] = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop these tables' snapshots instead (stop-snapshot).")
    ] = False,
    config: ConfigOpt = None,
    debug: DebugOpt = False,
    log_json: LogJsonOpt = False,
) -> None:
    """What ``SNAPSHOT_HELP`` says."""

    def go() -> None:
        settings = _settings(config, _log_overrides(log_json))
        _setup_logging(settings, debug, level="WARNING")
        from cdc.incremental.send import send_snapshot_signal
        from cdc.incremental.signals import quote_table

        sent = send_snapshot_signal(settings.postgres, tables or [], where, stop)
        listed = ", ".join(quote_table(t) for t in sent.tables) or "every table"
        typer.echo(f"{sent.kind} signal {sent.signal_id} for {listed} written at LSN {sent.lsn}")

    _guard(debug, go)


VERIFY_DRIFT_EXIT = 3  # drift found
VERIFY_UNSETTLED_EXIT = 4  # no drift, but keys that kept changing had no verdict

VERIFY_HELP = (
    "Compare each follower (Redis: cache, OpenSearch: search) with PostgreSQL, table by "
    "table (the publication's tables, or TABLES): missing keys (in PostgreSQL, not in the "
    "follower), extra keys (in the follower only) and differing rows, with example keys. "
    "Rows are compared as the follower stores them. Key ranges are folded into (count, hash) "
    "on each side and bisected where they differ (docs/verify.md)."
    "\n\nNo false drift under load: PostgreSQL is read in one REPEATABLE READ snapshot; each "
    "follower is read once its watermark has passed the snapshot's WAL position (waiting up "
    "to --fence-timeout); a key whose follower version is newer than the snapshot is not "
    "drift; every candidate is checked again in fresh snapshots and reported only when two "
    "checks in a row find it different; one still changing after several checks is "
    "reported as unsettled, not as drift."
    "\n\nExit status: 0 when every follower equals PostgreSQL; 3 when drift is found; 4 when "
    "no drift is found but some keys kept changing (unsettled: run it again); 2 when the "
    "settings are wrong (or a TABLE is not captured); 1 when a server cannot be read or a "
    "follower's watermark did not reach the snapshot in time. Errors are one line on stderr."
    "\n\n--repair then asks the reader to publish the missing and differing rows again (one "
    "signed incremental-snapshot signal per table, for those keys); the exit status still "
    "says what was found: run cdc verify again once the followers have applied them."
    "\n\nReads are paced to verify.max_rows_per_second rows a second (20,000 by default; 0: "
    "unbounded). Each pass is recorded in the reader's state topic, and cdc status shows the "
    "last one (unhealthy when it found drift)."
    "\n\n--every DURATION (30s, 10m, 1h) runs a pass each interval until Ctrl-C or SIGTERM, "
    "which end it with exit 0; one log line per pass (tables, rows checked, drift, time), "
    "with --json also one JSON line per pass on stdout; with --repair each pass repairs what "
    "it found. A failed pass is recorded and the next one runs at its time; a settings error "
    "ends the run (exit 2). --metrics-port (verify.metrics_port) serves cdc_verify_* "
    "Prometheus metrics on 127.0.0.1 meanwhile."
)


@app.command(help=VERIFY_HELP)
def verify(
    tables: TablesArg = None,
    follower: Annotated[
        str, typer.Option("--follower", help="Which follower: cache, search or all.")
    ] = "all",
    as_json: JsonOpt = False,
    fence_timeout: Annotated[
        float,
        typer.Option(
            "--fence-timeout",
            help="Seconds to wait for a follower's watermark to pass a snapshot.",
        ),
    ] = 60.0,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Then ask the reader to publish the missing and differing rows again (an "
            "incremental snapshot of those keys, as cdc snapshot sends): Kafka stays the "
            "source of truth. Extra keys are listed, not repaired: see --remove-extra.",
        ),
    ] = False,
    remove_extra: Annotated[
        bool,
        typer.Option(
            "--remove-extra",
            help="Then delete from the follower the rows PostgreSQL does not hold (extra "
            "keys): a follower-only repair, not through the log. Each key only if it is "
            "still extra when read again and nothing wrote to it in the follower since.",
        ),
    ] = False,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            help="Run a pass each DURATION (30s, 10m, 1h) until Ctrl-C or SIGTERM (exit 0).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="With --every: serve cdc_verify_* Prometheus metrics here (verify.metrics_port).",
        ),
    ] = None,
    config: ConfigOpt = None,
    debug: DebugOpt = False,
    log_json: LogJsonOpt = False,
) -> None:
    """What ``VERIFY_HELP`` says."""
    overrides = _log_overrides(log_json)
    if metrics_port is not None:
        overrides["verify"] = {"metrics_port": metrics_port}
    flag_names = {"verify.metrics_port": "--metrics-port"}

    def load() -> Settings:
        if follower not in ("cache", "search", "all"):
            raise ConfigError(f"--follower must be cache, search or all, not {follower!r}")
        return _settings(config, overrides, flag_names)

    if every is not None:

        def forever() -> None:
            from pgcdc.core.durations import parse_duration

            try:
                interval_s = parse_duration(every)
            except ValueError as e:
                raise ConfigError(f"--every: {e}") from e
            settings = load()
            _setup_logging(settings, debug)
            _quiet_libraries(debug)
            _verify_every(
                settings,
                tables or [],
                follower,
                fence_timeout,
                _Repairs(repair, remove_extra),
                interval_s,
                as_json,
            )

        _guard(debug, forever)
        return

    def go() -> dict[str, Any]:
        settings = load()
        _setup_logging(settings, debug, level="WARNING")
        _quiet_libraries(debug)
        return _verify(
            settings, tables or [], follower, fence_timeout, _Repairs(repair, remove_extra)
        )

    if not as_json:
        found = _guard(debug, go)
        typer.echo(scrub(found["text"], _SECRETS), nl=False)
    else:
        found = _json_guard(debug, go, lambda line: {"clean": False, "error": line})
        typer.echo(scrub(json.dumps(found["json"], indent=2), _SECRETS))
    if found["json"]["drift"]:
        raise typer.Exit(VERIFY_DRIFT_EXIT)
    if not found["json"]["clean"]:
        raise typer.Exit(VERIFY_UNSETTLED_EXIT)


@dataclasses.dataclass(frozen=True)
class _Repairs:
    """What a pass does about what it found: ``--repair`` (through the log) and
    ``--remove-extra`` (follower-only)."""

    through_log: bool = False
    remove_extra: bool = False

    def __bool__(self) -> bool:
        return self.through_log or self.remove_extra


def _verify(
    settings: Settings, tables: list[str], which: str, fence_timeout_s: float, repair: _Repairs
) -> dict[str, Any]:
    """A one-off ``cdc verify``: one pass, recorded for ``cdc status``."""
    import time

    from pgcdc.verify.report import as_record

    started = time.time()
    results, report, text = _verify_pass(settings, tables, which, fence_timeout_s, repair)
    recorder = _PassRecorder(settings)
    try:
        recorder.save(as_record(results, started, time.time()))
    finally:
        recorder.close()
    return {"json": report, "text": text}


class _PassRecorder:
    """Writes each pass's record where ``cdc status`` reads it: the reader's state topic,
    under this database and slot (:mod:`pgcdc.core.verify_record`). A record that cannot be
    written is one warning: the pass itself stands."""

    def __init__(self, settings: Settings) -> None:
        from cdc.state import StateStore

        self._settings = settings
        self._store = StateStore(settings.kafka, settings.kafka.topic_prefix)
        self._database: str | None = None

    def save(self, record: VerifyPass) -> None:
        from confluent_kafka import KafkaException
        from psycopg import Error as PostgresError

        from cdc.connection import connect, current_database

        try:
            if self._database is None:
                with connect(self._settings.postgres.dsn.get_secret_value()) as conn:
                    database = current_database(conn)
                self._store.ensure_topic()
                self._database = database
            self._store.save_verify(self._database, self._settings.postgres.slot_name, record)
        except (CdcError, KafkaException, PostgresError, OSError) as e:
            log.warning("the pass was not recorded for cdc status: %s", scrub(str(e), _SECRETS))

    def close(self) -> None:
        self._store.close()


def _verify_every(
    settings: Settings,
    tables: list[str],
    which: str,
    fence_timeout_s: float,
    repair: _Repairs,
    interval_s: float,
    as_json: bool,
) -> None:
    """``cdc verify --every``: passes until a signal; each recorded, counted in the
    metrics and said in one log line."""
    from pgcdc.core.durations import duration
    from pgcdc.core.verify_record import Outcome
    from pgcdc.verify.every import pass_line, run_every
    from pgcdc.verify.metrics import VerifyMetrics

    interrupt = Interrupt()
    interrupt.install()  # Ctrl-C and SIGTERM end the run (cdc.interrupt)
    metrics = VerifyMetrics()
    if settings.verify.metrics_port:
        metrics.serve(settings.verify.metrics_port)
    recorder = _PassRecorder(settings)
    done = [0]

    def one_pass() -> list[TableResult]:
        results, report, text = _verify_pass(settings, tables, which, fence_timeout_s, repair)
        if as_json:
            typer.echo(scrub(json.dumps(report), _SECRETS))
        for line in text.splitlines() if repair else ():
            if line.startswith(("repair:", "remove-extra:")):
                log.info("%s", line)
        return results

    def on_pass(record: VerifyPass) -> None:
        with interrupt.graceful():  # a signal now lets the record be written first
            recorder.save(record)
            metrics.on_pass(record)
            clean = record.outcome is Outcome.CLEAN
            log.log(logging.INFO if clean else logging.WARNING, "%s", pass_line(record))
            if as_json and record.outcome is Outcome.FAILED:  # a line on stdout for it too
                typer.echo(scrub(json.dumps({"clean": False, "error": record.error}), _SECRETS))
            done[0] += 1

    log.info(
        "verifying every %s, at most %s rows/s (verify.max_rows_per_second)",
        duration(interval_s),
        settings.verify.max_rows_per_second or "unbounded",
    )
    try:
        with interrupt.armed():
            run_every(interval_s, one_pass, on_pass, interrupt.stop)
    except KeyboardInterrupt:
        pass  # a pass cut short records nothing; the ones before it stand
    finally:
        recorder.close()
    log.info("stopped after %d pass(es)", done[0])


def _verify_pass(
    settings: Settings, tables: list[str], which: str, fence_timeout_s: float, repair: _Repairs
) -> tuple[list[TableResult], dict[str, Any], str]:
    """One pass of ``cdc verify``: the entry point wires PostgreSQL's reader (``cdc``), the
    followers' readers and the jobs' document converter (``pgcdc.verify``) together. The
    results, the JSON report and the text."""
    from cdc.verify_leader import PostgresLeader, tables_to_verify
    from cdc.verify_repair import Removal, keys_to_repair, remove_extra, removed_text, repairs_text
    from cdc.verify_repair import repair as send_repairs
    from pgcdc.verify.followers import (
        CacheFollower,
        CacheRemoval,
        SearchFollower,
        SearchRemoval,
        document_converter,
    )
    from pgcdc.verify.pacing import RowPacer
    from pgcdc.verify.report import as_json, as_text
    from pgcdc.verify.run import Follower, verify_pass_table
    from sinks.base import key_id
    from sinks.cache import CacheSink
    from sinks.search import SearchSink

    chosen = tables_to_verify(settings, tables)
    # One bucket for every read of the pass (verify.max_rows_per_second; 0: unbounded).
    rate = settings.verify.max_rows_per_second
    pacer = RowPacer(rate) if rate else None
    leader = PostgresLeader(
        settings, chosen, document_converter, key_id, pacer.take if pacer else None
    )
    followers: list[Follower] = []
    removals: dict[str, Removal] = {}
    with contextlib.ExitStack() as stack:
        if which in ("cache", "all"):
            cache = CacheSink.from_settings(settings.redis)
            stack.callback(cache.close)
            cache_follower = CacheFollower(cache, pacer=pacer)
            followers.append(cache_follower)
            removals["cache"] = CacheRemoval(cache_follower)
        if which in ("search", "all"):
            search = SearchSink.from_settings(settings.search)
            stack.callback(search.close)
            search_follower = SearchFollower(search, pacer=pacer)
            followers.append(search_follower)
            removals["search"] = SearchRemoval(search_follower)
        results: list[TableResult] = []
        for table in leader.table_ids:
            results += verify_pass_table(
                table,
                leader,
                followers,
                fence_timeout_s=fence_timeout_s,
                fold=settings.verify.fold_in_stores,
            )
        report, text = as_json(results), as_text(results)
        extra = sum(len(r.extra) for r in results)
        if repair.remove_extra and extra:
            removed = remove_extra(leader, removals, results)
            report["extra_removed"] = [dataclasses.asdict(r) for r in removed]
            extra -= sum(len(r.removed) for r in removed)
            text += removed_text(removed)
    if repair.through_log:
        sent = send_repairs(settings, leader, keys_to_repair(results))
        report["repairs"] = [dataclasses.asdict(r) for r in sent]
        text += repairs_text(sent, extra)
    if repair:
        report["extra_not_repaired"] = extra
    return results, report, text


topic_app = typer.Typer(
    help="Look at a topic's newest records, or write one (the project's Kafka settings: "
    "brokers, TLS, SASL; nothing else to install).",
    no_args_is_help=True,
)
app.add_typer(topic_app, name="topic")


@topic_app.command("tail")
def topic_tail(
    topic: Annotated[
        str | None,
        typer.Argument(help="The topic (e.g. cdc.public.orders); see --dead-letters."),
    ] = None,
    last: Annotated[
        int, typer.Option("--last", "-n", help="How many of the newest records.", min=1)
    ] = 10,
    dead_letters: Annotated[
        bool,
        typer.Option("--dead-letters", help="The dead-letter topic (kafka.dead_letter_topic)."),
    ] = False,
    config: ConfigOpt = None,
    debug: DebugOpt = False,
) -> None:
    """The newest records of a topic, oldest first: partition, offset, time, key and headers
    on one line, the value on the next. Says so when the topic is empty or does not exist
    (exit 0 either way; 1 when Kafka cannot be read)."""

    def go() -> None:
        settings = _settings(config, {})
        _setup_logging(settings, debug, level="WARNING")
        from cdc.topics import tail

        name = settings.kafka.dead_letter_topic if dead_letters else topic
        if not name:
            raise ConfigError("name a topic, or give --dead-letters")
        found = tail(settings.kafka, name, last)
        for record in found.records:
            typer.echo(scrub(record.render(), _SECRETS))
        note = ""
        if dead_letters and not found.exists:
            note = " (it is created with the first dead letter: nothing was dead-lettered)"
        typer.echo(f"{found.summary()}{note}", err=bool(found.records))

    _guard(debug, go)


@topic_app.command("send")
def topic_send(
    topic: Annotated[str, typer.Argument(help="The topic to write to.")],
    key: Annotated[str | None, typer.Option("--key", help="The record's key (text).")] = None,
    value: Annotated[
        str | None, typer.Option("--value", help="The record's value (else read from stdin).")
    ] = None,
    sign: Annotated[
        bool,
        typer.Option(
            "--sign",
            help="Sign the value (a JSON signal) with the reader's signal key, as the signal "
            "topic requires (an id and the signing time are added when missing).",
        ),
    ] = False,
    config: ConfigOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Write one record (value from --value or stdin) and wait for Kafka's acknowledgment,
    e.g. a signal for kafka.signal_topic (with --sign)."""

    def go() -> None:
        import sys

        settings = _settings(config, {})
        _setup_logging(settings, debug, level="WARNING")
        from cdc.topics import send

        body = (value if value is not None else sys.stdin.read().strip()).encode()
        if sign:
            from cdc.incremental.auth import sign_value

            body = sign_value(settings.postgres, body)
        partition, offset = send(
            settings.kafka, topic, key.encode() if key is not None else None, body
        )
        typer.echo(f"written to {topic} partition {partition} offset {offset}")

    _guard(debug, go)


config_app = typer.Typer(
    help="Show the effective settings, or check them against every service.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")

SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override one setting: section.name=value (repeatable; source 'flag')."
    ),
]
CHECK_FAILED_EXIT = 3


@config_app.command("show")
def config_show(config: ConfigOpt = None, assign: SetOpt = None, debug: DebugOpt = False) -> None:
    """Every effective setting, secrets masked, and where its value came from (default, file,
    env, flag)."""

    def go() -> None:
        from cdc.config_show import effective_rows, parse_assignments, render, set_flag_names

        overrides = parse_assignments(assign or [])
        settings = _settings(config, overrides, set_flag_names(overrides))
        rows = effective_rows(settings, config, overrides)
        # A value shown whole is already masked (a URL without a password is no secret);
        # any other secret still found in it is scrubbed.
        rows = [(n, scrub(v, [s for s in _SECRETS if s != v]), src) for n, v, src in rows]
        typer.echo(render(rows), nl=False)

    _guard(debug, go)


CHECK_HELP = (
    "Connect to PostgreSQL, Kafka, Redis and OpenSearch and check what the pipeline needs: "
    "wal_level, the role's REPLICATION and SELECT privileges, the captured tables' replica "
    "identities and keys, the publication (per postgres.publication_autocreate_mode), the slot."
    "\n\nPrints one line per check (ok, or FAIL with how to fix it). Exit status: 0 when "
    "every check passes, 3 when any fails, 2 when the settings themselves are invalid."
)


@config_app.command("check", help=CHECK_HELP)
def config_check(config: ConfigOpt = None, assign: SetOpt = None, debug: DebugOpt = False) -> None:
    """What ``CHECK_HELP`` says."""

    def go() -> bool:
        from cdc.config_check import run_checks
        from cdc.config_show import parse_assignments, set_flag_names

        overrides = parse_assignments(assign or [])
        settings = _settings(config, overrides, set_flag_names(overrides))
        _setup_logging(settings, debug, level="CRITICAL")
        _quiet_libraries(debug)
        results = run_checks(settings)
        for result in results:
            typer.echo(scrub(result.line(), _SECRETS))
        failed = sum(not r.ok for r in results)
        typer.echo(f"{failed} problem(s)" if failed else "all checks passed")
        return failed == 0

    if not _guard(debug, go):
        raise typer.Exit(CHECK_FAILED_EXIT)


def main() -> None:
    """Console-script entry point."""
    app()
