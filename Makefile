# C helpers of hpcvm.  `make all` (run by scripts/setup.sh) builds them into
# src/hpcvm/data/, where the package finds them (hpcvm.bench.suites.noise.suite.noise_binary()).
#
# No -march=native, ever: the same binaries run natively and inside guests, and a TCG
# guest's CPU model lacks the host's newer instructions (QEMU 7.2 TCG has no AVX-512),
# so a host-tuned binary would die with SIGILL there.  On x86-64 we pin the baseline
# ISA explicitly so that a CFLAGS from the environment cannot raise it by accident.

CC ?= cc
CFLAGS ?= -O2
WARNINGS := -Wall -Wextra -Werror -std=gnu11
ARCH_FLAGS := $(if $(filter x86_64,$(shell uname -m)),-march=x86-64 -mtune=generic,)
DATA_DIR := src/hpcvm/data

MPICC ?= $(shell command -v mpicc.openmpi || command -v mpicc)
HELPERS := $(DATA_DIR)/hpcvm-noise
# the bsp suite's MPI program needs Open MPI's compiler wrapper (libopenmpi-dev);
# without it the rest still builds and `--suite bsp` says what to install
ifneq ($(MPICC),)
HELPERS += $(DATA_DIR)/hpcvm-bsp
endif
# the anti-spoofing helper (installed setuid root by scripts/install-node.sh) needs
# libnftables and jansson (libnftables-dev, libjansson-dev: scripts/setup.sh)
NFT_LIBS := $(shell pkg-config --libs libnftables jansson 2>/dev/null)
ifneq ($(NFT_LIBS),)
HELPERS += $(DATA_DIR)/hpcvm-netguard
endif

.PHONY: all clean

all: $(HELPERS)

$(DATA_DIR)/hpcvm-noise: csrc/noise.c csrc/work.h Makefile
	@mkdir -p $(DATA_DIR)
	$(CC) $(CFLAGS) $(ARCH_FLAGS) $(WARNINGS) -pthread -o $@ $<

$(DATA_DIR)/hpcvm-bsp: csrc/bsp.c csrc/work.h Makefile
	@mkdir -p $(DATA_DIR)
	$(MPICC) $(CFLAGS) $(ARCH_FLAGS) $(WARNINGS) -o $@ $<

$(DATA_DIR)/hpcvm-netguard: csrc/hpcvm-netguard.c Makefile
	@mkdir -p $(DATA_DIR)
	$(CC) $(CFLAGS) $(ARCH_FLAGS) $(WARNINGS) -D_FORTIFY_SOURCE=2 -fstack-protector-strong \
		-fPIE -pie -Wl,-z,relro,-z,now -o $@ $< $(shell pkg-config --cflags libnftables jansson) \
		$(NFT_LIBS)

clean:
	rm -f $(HELPERS) $(DATA_DIR)/hpcvm-bsp $(DATA_DIR)/hpcvm-netguard
