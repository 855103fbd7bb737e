"""The embedded dev stack behind ``tessera up`` and the tests: servers
(:mod:`shared.devstack.stack`), processes (:mod:`shared.devstack.procs`), the
supervisor (:mod:`shared.devstack.supervisor`) and the NATS users
(:mod:`shared.devstack.natsauth`).
"""
