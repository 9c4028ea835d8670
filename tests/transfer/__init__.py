"""kvcompat.transfer: plans, engine bindings, the two-process example."""
