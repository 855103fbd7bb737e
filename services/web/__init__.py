"""``tessera web``: the browser console and the HTTP API, over the gateway's NATS API."""
