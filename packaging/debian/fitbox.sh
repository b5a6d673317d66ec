#!/bin/sh
# /usr/bin/fitbox: the command of the fitbox installed in its own venv by the package.
exec /opt/fitbox/venv/bin/fitbox "$@"
