"""Settings: built once from an injectable mapping, frozen, passed explicitly, grouped by concern.

Nothing reads the environment at import time. ``Settings.from_env(os.environ)`` validates every
value and raises :class:`~shared.core.errors.ConfigError` naming the variable that is missing or
malformed, so a service fails at start-up rather than at the first message.

A :class:`Settings` holds where the deployment's servers are (``nats_urls``, ``database_url``,
``object_store``) and who this process is (``node``), then one frozen group per concern:
``deployment`` (namespace and what JetStream objects are declared), ``leases``, ``delivery``,
``worker``, ``scheduler``, ``sweeper``, ``finalizer``, ``gateway``, ``client`` and ``process``
(logs, metrics, shutdown). Every knob is a field of one group, declared with :func:`_knob`: its
default, its ``TESSERA_*`` variable, its meaning and who reads it. That declaration is the only
default of the knob: every other place (:class:`proto.topology.Topology`, the caches, the
consume loops) takes its value from these settings or from the group's class attribute.

:func:`knob_table` renders every variable as the Markdown table in ``docs/operations.md``
(``python -m shared.core.config docs/operations.md`` rewrites it there; a test keeps the two equal).

The package's modules, by role: :mod:`~shared.core.config.knobs` (:func:`_knob`),
:mod:`~shared.core.config.common` (the groups every process or every service reads: deployment,
leases, delivery, client, process, and the object store), :mod:`~shared.core.config.roles` (the
groups of one service role each: worker, scheduler, sweeper, finalizer, gateway),
:mod:`~shared.core.config.settings` (:class:`Settings`), :mod:`~shared.core.config.parse` (reading
and checking the environment) and :mod:`~shared.core.config.table` (the docs table).
"""

from __future__ import annotations

from shared.core.config.common import (
    ClientSettings,
    DeliverySettings,
    DeploymentSettings,
    LeaseSettings,
    ObjectStoreSettings,
    ProcessSettings,
)
from shared.core.config.knobs import MiB as MiB
from shared.core.config.roles import MAX_URL_TTL as MAX_URL_TTL
from shared.core.config.roles import (
    FinalizerSettings,
    GatewaySettings,
    SchedulerSettings,
    SweeperSettings,
    WebSettings,
    WorkerSettings,
)
from shared.core.config.settings import Settings, variables, worker_settings
from shared.core.config.settings import _knobs as _knobs
from shared.core.config.table import TABLE_BEGIN as TABLE_BEGIN
from shared.core.config.table import TABLE_END as TABLE_END
from shared.core.config.table import documented_table as documented_table
from shared.core.config.table import knob_table

__all__ = [
    "ClientSettings",
    "DeliverySettings",
    "DeploymentSettings",
    "FinalizerSettings",
    "GatewaySettings",
    "LeaseSettings",
    "ObjectStoreSettings",
    "ProcessSettings",
    "SchedulerSettings",
    "Settings",
    "SweeperSettings",
    "WebSettings",
    "WorkerSettings",
    "knob_table",
    "variables",
    "worker_settings",
]
