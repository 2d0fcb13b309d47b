"""Board constraint files (TOML), shipped as package data; see ``ina_fabric.hw.build``."""
