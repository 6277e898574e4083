"""Plumbing every Sandpod service shares: one ``serve()`` loop, logging, metrics, task owners."""

from sandpod_service.env import env_bool, env_float, env_int, env_str
from sandpod_service.logs import configure_logging
from sandpod_service.serve import Service, serve
from sandpod_service.tasks import Supervisor

__all__ = [
    "Service",
    "Supervisor",
    "configure_logging",
    "env_bool",
    "env_float",
    "env_int",
    "env_str",
    "serve",
]
