"""The declared documents (``[[search.documents]]``, :mod:`pgcdc.core.document_settings`) as
the join core's :class:`~spark_jobs.join.DocumentSpec`: the one place the settings become
specs.

Tables are named as the followers name them, the table id ``<schema>.<table>`` of
:func:`pgcdc.core.contract.table_id` (plain lower-case names unchanged: ``public.products``),
which is what :func:`pgcdc.core.contract.table_of_topic` gives for a change topic: a change
read from a topic is matched to a document's tables by that id.
"""

from __future__ import annotations

from pgcdc.core.contract import document_index, table_id
from pgcdc.core.document_settings import DocumentSettings
from pgcdc.core.qualified_names import split_qualified
from pgcdc.core.settings import SearchSettings
from spark_jobs.join import Aggregate, DocumentSpec, Lookup, Nested


def _table(name: str) -> str:
    return table_id(*split_qualified(name))


def document_spec(doc: DocumentSettings) -> DocumentSpec:
    """One declared document as the join core's spec."""
    return DocumentSpec(
        root=_table(doc.table),
        root_key=doc.key,
        fields=doc.fields,
        lookups=tuple(
            Lookup(
                lk.name,
                _table(lk.table),
                on=lk.foreign_key,
                key=lk.references,
                fields=lk.fields,
            )
            for lk in doc.lookups
        ),
        nested=tuple(
            Nested(
                n.name,
                _table(n.table),
                on=n.foreign_key,
                fields=n.fields,
                aggregates=tuple(
                    Aggregate(name, function, column)
                    for name, function, column in n.parsed_aggregates()
                ),
            )
            for n in doc.nested
        ),
    )


def document_specs(search: SearchSettings) -> dict[str, DocumentSpec]:
    """Every declared document's index (``<index_prefix>-<name>``) -> its spec, in the
    order declared."""
    return {
        document_index(search.index_prefix, doc.name): document_spec(doc)
        for doc in search.documents
    }
