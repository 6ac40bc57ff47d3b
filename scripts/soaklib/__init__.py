"""The fault-injection soak's parts (see scripts/soak.py)."""
