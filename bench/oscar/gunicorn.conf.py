"""Gunicorn's configuration for the Oscar peer: none of the shop's (/gunicorn.conf.py).

The shop's file, which gunicorn would read from the working directory, sets
up the shop's metrics; the peer runs with gunicorn's defaults and the
command line of bench.server.Gunicorn.
"""
