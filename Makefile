# Conveniences; scripts/dev.sh does the work and bootstraps what it needs.
.PHONY: run test setup bench packages image
run:
	scripts/dev.sh run
test:
	scripts/dev.sh test
setup:
	scripts/dev.sh setup
bench: setup
	.venv/bin/python -m bench.collect --pods 200 --json
	.venv/bin/python -m bench.daemon --pods 200 --json
packages: setup
	packaging/build.sh
image: setup
	python3 packaging/image.py --out dist/koordinator-py.oci.tar
