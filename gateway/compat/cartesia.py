from __future__ import annotations


def add_routes(router, gateway, executor):
    pass
