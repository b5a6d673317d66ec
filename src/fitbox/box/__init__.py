"""The runtime: residents, the placement lock, applying plans, leases for calls."""
