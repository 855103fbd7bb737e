"""In-memory doubles of Tessera's stores, held to the real ones by contract tests.

``tests/doubles/test_contract.py`` runs the same cases against each double and the real
adapter (NATS KV through :mod:`shared.nats.leases`), so a double cannot drift from what it stands
for.
"""
