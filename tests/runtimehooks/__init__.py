"""Tests of the runtime hooks: framework, hooks, hook server, NRI plugin, koord-runtime-proxy."""
