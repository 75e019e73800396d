"""The policies a simulation compares, by name: orchestrator/policies/named.py, where the live scheduler
(`corral scheduler --policy NAME`) finds them too, so both run the very same `Policies` records."""

from orchestrator.policies.named import (
    BASELINE,
    POLICY_NAMES,
    dominant_share,
    hold_everything,
    no_reservation,
    one_line,
    parse_policies,
    policies_for,
    submit_order,
)

__all__ = ["BASELINE", "POLICY_NAMES", "dominant_share", "hold_everything", "no_reservation", "one_line",
           "parse_policies", "policies_for", "submit_order"]
