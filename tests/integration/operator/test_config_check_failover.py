"""``cdc config check`` on PostgreSQL 17+ with a standby: both sides of a failover slot.

A primary and a streaming standby set up as a plain replica: the check names each missing
piece (the DSN's target_session_attrs, the primary's synchronized_standby_slots, the
standby's sync_replication_slots and hot_standby_feedback, the slot's missing copy) with its
fix. Once both sides are set and the failover slot's copy is ready, every line is ok.

Runs on the major ``CDC_TEST_POSTGRES`` asks for when it is 17+, else on the newest.
"""

from __future__ import annotations

import pytest

from tests.conftest import Endpoints, wait_until
from tests.integration.operator.test_config_check import _check
from tests.pg_majors import feature_major, server, standby_of

pytestmark = [pytest.mark.integration]

SLOT = "cdc_slot"


def test_config_check_verifies_both_sides_of_a_failover_slot(endpoints: Endpoints) -> None:
    with (
        server(feature_major(17, "failover slots"), name="primary") as primary,
        standby_of(primary, slot="standby1") as standby,
    ):
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        env = {
            "CDC_POSTGRES__DSN": f"postgresql://cdc:cdc@{hosts}/cdc",
            "CDC_KAFKA__BOOTSTRAP_SERVERS": endpoints.kafka_bootstrap,
            "CDC_REDIS__URL": endpoints.redis_url,
            "CDC_SEARCH__URL": endpoints.search_url,
            # The throwaway servers' password (cdc) is too short to derive a signal key.
            "CDC_POSTGRES__SIGNAL_SECRET": "a-signal-key-of-the-failover-test",
        }
        first = _check(env)
        assert first.returncode != 0
        for expected in (
            "target_session_attrs=any: the reader may connect to a standby",
            "synchronized_standby_slots is empty (physical slots: standby1)",
            "fix: ALTER SYSTEM SET synchronized_standby_slots = 'standby1'",
            f"standby 127.0.0.1:{standby.port}: sync_replication_slots = off",
            f"standby 127.0.0.1:{standby.port}: hot_standby_feedback = off",
            f"no synchronized copy of slot {SLOT} ready",
        ):
            assert expected in first.stdout, first.stdout

        primary.query("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
        primary.query("SELECT pg_reload_conf()")
        for name in ("sync_replication_slots", "hot_standby_feedback"):
            standby.query(f"ALTER SYSTEM SET {name} = on")
        standby.query("SELECT pg_reload_conf()")
        # The reader's failover slot (made here by SQL: slot name, plugin, temporary,
        # two-phase, failover), moved on until the standby's copy is ready.
        primary.query(
            f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput', false, false, true)",
            db="cdc",
        )

        def synced() -> bool:
            primary.query(
                "CREATE TABLE IF NOT EXISTS t (id serial PRIMARY KEY); INSERT INTO t DEFAULT VALUES",
                db="cdc",
            )
            primary.query(
                f"SELECT count(*) FROM pg_logical_slot_get_binary_changes('{SLOT}', NULL, NULL, "
                "'proto_version', '1', 'publication_names', 'cdc_pub')",
                db="cdc",
            )
            primary.query("SELECT pg_log_standby_snapshot()")
            copy = standby.query(
                f"SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
            )
            return copy == "t"

        primary.query("CREATE PUBLICATION cdc_pub FOR ALL TABLES", db="cdc")
        wait_until(synced, timeout=120, what="the standby's copy of the slot")
        second = _check(
            {
                **env,
                "CDC_POSTGRES__DSN": env["CDC_POSTGRES__DSN"] + "?target_session_attrs=read-write",
                # A slot made by SQL is no reader's own (cdc.ownership): the reader takes it.
                "CDC_POSTGRES__ADOPT_SLOT": "true",
            }
        )
        assert second.returncode == 0, second.stdout
        assert "synchronized_standby_slots = standby1" in second.stdout
        assert "postgres.adopt_slot takes it" in second.stdout
        assert f"standby 127.0.0.1:{standby.port}: slot {SLOT} is synchronized" in second.stdout
