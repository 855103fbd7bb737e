"""The Tessera client: :class:`~services.client.api.TesseraClient` and the ``tessera`` commands.

- :mod:`services.client.api` — typed request-reply calls to the gateway;
- :mod:`services.client.commands` — ``submit``, ``status``, ``watch``, ``get``, ``list``,
  ``cancel``, ``retry``, ``dlq`` (argument parsing and exit codes);
- :mod:`services.client.actions` — what those commands do;
- :mod:`services.client.watch` — live progress bars;
- :mod:`services.client.session` — settings, connections and the exit-code mapping.
"""
