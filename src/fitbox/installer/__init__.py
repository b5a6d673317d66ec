"""`fitbox install` / `uninstall`: the service units, config and paths. Never serves."""
