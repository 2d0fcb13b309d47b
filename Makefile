# INA-Fabric. `make demo` trains with aggregation offloaded; `make test` runs every test.
# Both install what they need first (make setup).

VENV   ?= .venv
PY     := $(VENV)/bin/python
INA    := $(VENV)/bin/ina
STAMP  := $(VENV)/.installed
JOBS   ?= 2
BOARD  ?= versa_ecp5

.PHONY: setup test demo demo-rtl demo-board bench sim bitstream program report clean help

help:
	@echo "make demo       train digits on 4 workers through the software switch, vs Gloo"
	@echo "make demo-rtl   the same training through the gateware in Verilator (RTL in the loop)"
	@echo "make demo-board the same training through the whole board's datapath in Verilator on a"
	@echo "                TAP (root; many minutes), then through the software switch: same replicas"
	@echo "make test       run every test (pytest, cocotb on Icarus)"
	@echo "make bench      benchmarks; figures to bench/results/*.json"
	@echo "make sim        cocotb benches alone (WAVES=1 TEST=name for waveforms)"
	@echo "make bitstream  BOARD=$(BOARD): a real bitstream with the YoWASP toolchain"
	@echo "                (boards: versa_ecp5, ecpix5_85; colorlight_5a75b builds but misses timing;"
	@echo "                 the Versa's has the in-band control plane and this machine's switch key)"
	@echo "make program    load it with openFPGALoader"

setup: $(STAMP)

# setup.py and the C sources: the compiled data path is rebuilt when they change
$(STAMP): requirements.txt pyproject.toml setup.py $(wildcard host/*/*.c ina_fabric/protocol/*.h)
	@command -v iverilog >/dev/null && command -v tshark >/dev/null && command -v gcc >/dev/null && command -v verilator >/dev/null && command -v g++ >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y iverilog tshark gcc g++ verilator; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

test: setup
	$(PY) -m pytest -n $(JOBS) --dist loadgroup tests

# On a rack lab (4 host namespaces, 1 Gbit links, ina switch in the network) where it
# can (root, namespaces, pyroute2: see docs/lab.md), else on loopback; it says which.
LABCHECK := import sys; from ina_fabric.host.lab import available; w = available(); print(w or ""); sys.exit(bool(w))
demo: setup
	@if why=$$($(PY) -c '$(LABCHECK)' 2>&1); then \
	  echo "make demo: on a rack lab (4 host namespaces, 1 Gbit links, ina lab)"; \
	  $(INA) train --workers 4 --plot --out ina-out/demo --lab rack; \
	else \
	  echo "make demo: on loopback (no lab here: $$why)"; \
	  $(INA) train --workers 4 --plot --out ina-out/demo; \
	fi

# The same training with every gradient datagram through the INA core (hw/ina) simulated
# by Verilator, the reference model beside it as a live scoreboard (ina switch --engine
# rtl); prints the table of make demo and the core's figures and counters.
demo-rtl: setup
	$(INA) train --workers 4 --engine rtl --plot --out ina-out/demo-rtl

# The same training through the Versa board's whole datapath (MAC, ARP/IPv4/UDP, the
# in-band control plane with the key, the core, the replicator) in Verilator, bridged to a
# TAP in a namespace of its own (ina switch --engine board; root). Then the same run
# through the software switch with the board's window and elements per packet: the
# replicas must be bitwise the same.
BOARDCMP := import json, sys; a, b = (json.load(open(f"ina-out/{d}/results.json"))["ina"] for d in ("demo-board", "demo-board-soft")); same = len(set(a["param_hashes"])) == 1 and a["param_hashes"] == b["param_hashes"]; acc = a["final_accuracy"]; print(f"board: accuracy {acc:.3f}; replicas bitwise those of the software switch: {same}"); sys.exit(0 if same else 1)
demo-board: setup
	$(INA) train --workers 4 --engine board --backends ina --plot --out ina-out/demo-board
	$(INA) train --workers 4 --engine fast --backends ina --window 8 --elements 64 \
	  --out ina-out/demo-board-soft
	$(PY) -c '$(BOARDCMP)'

bench: setup
	$(INA) bench all

clean:
	rm -rf build bench/results ina-out .pytest_cache sim_build

# Gateware: cocotb benches (WAVES=1 writes waveforms), bitstream, programming.
sim: setup
	$(PY) -m ina_fabric.sim.run $(if $(TEST),--test $(TEST)) $(if $(WAVES),--waves)

bitstream: setup
	$(PY) -m ina_fabric.hw.build --board $(BOARD)

report: setup
	$(INA) bench hw

program:
	@command -v openFPGALoader >/dev/null || { apt-get update && apt-get install -y openfpgaloader; }
	openFPGALoader --board $(BOARD) build/$(BOARD)/top.bit || openFPGALoader -c ft2232 build/$(BOARD)/top.bit
