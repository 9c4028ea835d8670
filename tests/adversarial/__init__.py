"""The adversarial tier: bad inputs, faults, races; every reachable byte checked."""
