"""The central: many boxes behind one address. A second role of the same program; it reads
the box's leaves (store, keys, trust, config) and the box never imports it."""
