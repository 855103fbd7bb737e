"""Run Tessera's services as real OS processes for end-to-end and chaos tests.

The same :class:`services.cli.local.ServiceProcesses` that ``tessera up`` uses: each service is a
:class:`shared.devstack.procs.ManagedProcess` (own process group, parent-death guard, log file), so
a test can SIGKILL, SIGSTOP or restart it like a supervisor would, and nothing outlives the test.
"""

from services.cli.local import ServiceProcesses

__all__ = ["ServiceProcesses"]
