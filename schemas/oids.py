"""OIDs of PostgreSQL's built-in types (fixed since forever: see pg_type.dat)."""

from __future__ import annotations

from typing import Final

BOOL: Final = 16
BYTEA: Final = 17
CHAR: Final = 18
NAME: Final = 19
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
OID: Final = 26
XID: Final = 28
JSON: Final = 114
XML: Final = 142
POINT: Final = 600
CIDR: Final = 650
FLOAT4: Final = 700
FLOAT8: Final = 701
MACADDR8: Final = 774
MONEY: Final = 790
MACADDR: Final = 829
INET: Final = 869
BPCHAR: Final = 1042
VARCHAR: Final = 1043
DATE: Final = 1082
TIME: Final = 1083
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
INTERVAL: Final = 1186
TIMETZ: Final = 1266
BIT: Final = 1560
VARBIT: Final = 1562
NUMERIC: Final = 1700
UUID: Final = 2950
JSONB: Final = 3802
INT4RANGE: Final = 3904
NUMRANGE: Final = 3906
TSRANGE: Final = 3908
TSTZRANGE: Final = 3910
DATERANGE: Final = 3912
INT8RANGE: Final = 3926
