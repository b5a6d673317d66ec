#!/bin/sh
# /usr/bin/fitbox: the command of the fitbox the package installed in its own venv. It works
# on the service's own home, as the service does, whoever runs it: the service's settings
# (/etc/fitbox/fitbox.env, root's to read) are taken for any not set already, the home is
# the unit's state directory, and root runs every command but install, uninstall and update
# as the service's user, so what it writes in the store (a key, its -wal) stays the
# service's and `sudo fitbox keys create` makes a key the service accepts.
FITBOX=/opt/fitbox/venv/bin/fitbox
ENV_FILE=/etc/fitbox/fitbox.env
if [ -r "$ENV_FILE" ]; then
    while IFS='=' read -r name value; do
        case "$name" in
            FITBOX_*[!A-Z0-9_]* | "") ;;  # not a setting's name: skipped
            FITBOX_*) eval "[ -n \"\${$name+set}\" ]" || export "$name=$value" ;;
        esac
    done <"$ENV_FILE"
fi
[ -n "${FITBOX_HOME+set}" ] || export FITBOX_HOME=/var/lib/fitbox
if [ "$(id -u)" = 0 ] && id -u fitbox >/dev/null 2>&1; then
    case "$1" in
        install | uninstall | update) ;;
        *) exec runuser -u fitbox -- "$FITBOX" "$@" ;;
    esac
fi
exec "$FITBOX" "$@"
