"""The code the services share: the runtime, consuming and settling messages,
heartbeats, announcements, dead letters, requeue, logs and metrics.
"""
