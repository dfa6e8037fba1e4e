"""Arrow schemas and typed records for every kernelsynth table."""

from schemas.base import Record, SchemaError, check_table, dumps
from schemas.records import (
    OP_FAMILIES,
    RECORD_TYPES,
    Candidate,
    Finding,
    Message,
    PreferenceRow,
    RawModule,
    Rejection,
    RepairRow,
    RftRow,
    SftRow,
    Task,
    TensorSpec,
    Verdict,
    content_hash,
)

__all__ = [
    "OP_FAMILIES",
    "RECORD_TYPES",
    "Candidate",
    "Finding",
    "Message",
    "PreferenceRow",
    "RawModule",
    "Record",
    "Rejection",
    "RepairRow",
    "RftRow",
    "SchemaError",
    "SftRow",
    "Task",
    "TensorSpec",
    "Verdict",
    "check_table",
    "content_hash",
    "dumps",
]
