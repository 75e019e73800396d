"""Every type corral puts on the wire. Pure: no IO, no clock, no randomness."""

from schemas.codec import CODEC, Codec, decode, encode
from schemas.datasets import Dataset
from schemas.events import *  # noqa: F403
from schemas.events import EVENT_TAGS, EVENT_TYPES, AnyEvent, Event, Unknown, entity_of, tag_of
from schemas.inventory import Gpu, Inventory, link_score
from schemas.jobspec import (
    ArrayElement,
    Gates,
    InvalidJobSpec,
    JobSpec,
    Mount,
    Problem,
    Topology,
    jobspec_problems,
    parse_jobspec,
)

__all__ = [
    "CODEC",
    "EVENT_TAGS",
    "EVENT_TYPES",
    "AnyEvent",
    "ArrayElement",
    "Codec",
    "Dataset",
    "Event",
    "Gates",
    "Gpu",
    "InvalidJobSpec",
    "Inventory",
    "JobSpec",
    "Mount",
    "Problem",
    "Topology",
    "Unknown",
    "decode",
    "encode",
    "entity_of",
    "jobspec_problems",
    "link_score",
    "parse_jobspec",
    "tag_of",
]
