"""``tessera web``: the web console and the HTTP JSON API, its own process.

It reaches the farm only through the gateway's NATS API (:mod:`services.client.api`), under its
own least-privilege NATS user ``web`` (:mod:`shared.devstack.natsauth`): never PostgreSQL, never
the object store. :mod:`.app` builds the aiohttp application, :mod:`.api` the JSON routes,
:mod:`.openapi` their OpenAPI 3.1 document, :mod:`.events` the server-sent events, :mod:`.auth`
tokens, roles and CSRF; :mod:`.pages` the console's pages.
"""
