# Set-up is two commands on a fresh machine:  make demo  and  make test.

CARGO ?= cargo

.PHONY: demo test deps lint bench examples model-check unprivileged redis-up redis-down c-lib umap-bench seed-preload

# userfaultfd-sys generates its bindings with bindgen, which needs libclang.
# The far-memory tests need Redis (a standalone server and a 3-node
# cluster on loopback ports, started by scripts/redis-servers.sh).
deps:
	@if ! ldconfig -p | grep -q 'libclang[-.0-9]*\.so'; then \
		echo "installing libclang (needed by userfaultfd-sys/bindgen)"; \
		apt-get update -qq && apt-get install -y -qq libclang1-14 >/dev/null; \
	fi
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then \
		echo "installing redis-server and redis-tools (needed by the far-memory tests)"; \
		apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; \
	fi
	@if ! command -v sqlite3 >/dev/null || ! test -x /usr/bin/python3 || ! command -v cc >/dev/null; then \
		echo "installing sqlite3, python3 and gcc (programs the LD_PRELOAD shim's tests run)"; \
		apt-get update -qq && apt-get install -y -qq sqlite3 python3 gcc >/dev/null; \
	fi

# Where the tests find the servers (scripts/redis-servers.sh's defaults).
export UFFD_REDIS_URL ?= redis://127.0.0.1:6390
export UFFD_REDIS_CLUSTER_URL ?= redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002

redis-up: deps
	scripts/redis-servers.sh start

redis-down:
	scripts/redis-servers.sh stop

demo: deps
	$(CARGO) run --release --quiet --bin uffd-pager -- demo

# Starts the Redis servers, runs every test, and stops the servers again
# whatever the tests did.
test: deps
	scripts/redis-servers.sh start >/dev/null
	$(CARGO) test --workspace --features uffd-pager/fault-inject,uffd-pager/redis; \
		rc=$$?; scripts/redis-servers.sh stop >/dev/null; exit $$rc

# Model-checks the concurrency primitives (page lock, region lock, global
# lock, RCU) with loom: tests/loom_sync/. `--cfg loom` changes every crate's
# flags, so it builds in a target directory of its own instead of
# invalidating the normal one. LOOM_MAX_PREEMPTIONS=N overrides the bound.
model-check: deps
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test --release -p uffd-pager --test loom_sync

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features uffd-pager/fault-inject,uffd-pager/redis -- -D warnings
	$(CARGO) clippy -p uffd-pager --all-targets --features fault-inject -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet --features uffd-pager/redis

bench: deps
	$(CARGO) run --release --quiet --bin uffd-pager -- bench fault-cost

# The embedding examples verify their own results and exit non-zero if not.
examples: deps
	$(CARGO) run --release --quiet --example embed_file
	$(CARGO) run --release --quiet --example out_of_core_sort
	$(CARGO) run --release --quiet --example anon_swap

# The examples and short tortures (one over Redis) as an ordinary user (uid 65534, as
# vm.unprivileged_userfaultfd = 0 and a root-only /dev/userfaultfd leave
# it): user-mode-only userfaultfd(2). Run as root; the binaries are copied
# where that user can run them.
UNPRIV := setpriv --reuid=65534 --regid=65534 --clear-groups
unprivileged: deps
	$(CARGO) build --release --quiet --examples --bin uffd-pager
	rm -rf /tmp/uffd-pager-unpriv && install -d -m 755 /tmp/uffd-pager-unpriv
	install -m 755 target/release/uffd-pager target/release/examples/embed_file \
		target/release/examples/out_of_core_sort target/release/examples/anon_swap /tmp/uffd-pager-unpriv/
	cd /tmp && for e in embed_file out_of_core_sort anon_swap; do $(UNPRIV) /tmp/uffd-pager-unpriv/$$e || exit 1; done
	cd /tmp && $(UNPRIV) /tmp/uffd-pager-unpriv/uffd-pager torture --ops 300000 --pages 4096 --budget 1024 --kind anonymous
	cd /tmp && $(UNPRIV) /tmp/uffd-pager-unpriv/uffd-pager torture --ops 300000 --pages 4096 --budget 1024 --delivery threads --dir /tmp
	# 2 MiB pages as the unprivileged user: root reserves 16 and gives them back.
	before=$$(cat /proc/sys/vm/nr_hugepages); echo $$((before + 16)) > /proc/sys/vm/nr_hugepages; \
		cd /tmp && for k in anonymous file; do $(UNPRIV) /tmp/uffd-pager-unpriv/uffd-pager torture --ops 20000 \
		--page-size 2M --pages 32 --budget 8 --kind $$k $$([ $$k = file ] && echo --dir /tmp) || { rc=1; break; }; done; \
		echo $$before > /proc/sys/vm/nr_hugepages; exit $${rc:-0}
	scripts/redis-servers.sh start >/dev/null
	cd /tmp && $(UNPRIV) /tmp/uffd-pager-unpriv/uffd-pager torture --ops 300000 --pages 4096 --budget 1024 \
		--store $(UFFD_REDIS_URL); rc=$$?; cd $(CURDIR) && scripts/redis-servers.sh stop >/dev/null; exit $$rc
	$(MAKE) --no-print-directory c-lib PREFIX=/tmp/uffd-pager-unpriv/c
	cc -O2 -pthread -I/tmp/uffd-pager-unpriv/c/include capi/tests/c/api.c -L/tmp/uffd-pager-unpriv/c/lib \
		-luffd_pager -Wl,-rpath,/tmp/uffd-pager-unpriv/c/lib -o /tmp/uffd-pager-unpriv/c_api
	cd /tmp && $(UNPRIV) /tmp/uffd-pager-unpriv/c_api /tmp/uffd-c-api-$$$$.dat
	head -c 16M /dev/urandom > /tmp/uffd-pager-unpriv/shim.dat && chmod 644 /tmp/uffd-pager-unpriv/shim.dat
	install -m 644 preload/tests/hash.py /tmp/uffd-pager-unpriv/
	cd /tmp && want=$$(/usr/bin/python3 /tmp/uffd-pager-unpriv/hash.py /tmp/uffd-pager-unpriv/shim.dat) && \
		got=$$($(UNPRIV) env LD_PRELOAD=/tmp/uffd-pager-unpriv/c/lib/libuffd_pager_preload.so \
			UFFD_PAGER_FILES='/tmp/uffd-pager-unpriv/*.dat' UFFD_PAGER_BUDGET=4M \
			/usr/bin/python3 /tmp/uffd-pager-unpriv/hash.py /tmp/uffd-pager-unpriv/shim.dat) && \
		test "$$want" = "$$got" && echo "shim as uid 65534: $$got"
	rm -rf /tmp/uffd-pager-unpriv

# The C library, installed under target/c (PREFIX=... elsewhere): lib/ has
# libuffd_pager.so, libuffd_pager.a and libuffd_pager_preload.so,
# include/ has uffd_pager.h and umap/umap.h, lib/pkgconfig/uffd_pager.pc.
PREFIX ?= $(CURDIR)/target/c
c-lib: deps
	$(CARGO) build --release --quiet -p uffd-pager-capi -p uffd-pager-preload
	install -d $(PREFIX)/lib/pkgconfig $(PREFIX)/include/umap
	install -m 755 target/release/libuffd_pager_preload.so $(PREFIX)/lib/
	install -m 755 target/release/libuffd_pager.so $(PREFIX)/lib/libuffd_pager.so.1
	ln -sf libuffd_pager.so.1 $(PREFIX)/lib/libuffd_pager.so
	install -m 644 target/release/libuffd_pager.a $(PREFIX)/lib/
	install -m 644 capi/include/uffd_pager.h $(PREFIX)/include/
	install -m 644 capi/include/umap/umap.h $(PREFIX)/include/umap/
	sed 's|@PREFIX@|$(PREFIX)|' capi/uffd_pager.pc.in > $(PREFIX)/lib/pkgconfig/uffd_pager.pc

# UMap's random-read benchmark shape on this engine, built against
# <umap/umap.h>: a 256 MiB file on tmpfs, a 64 MiB buffer, 1 and 2 threads,
# three runs each (UMAP_PAGE_FILLERS / _EVICTORS as UMap's run: 2 and 2).
UMAP_RUNS ?= 3
umap-bench: c-lib
	cc -O2 -pthread -I$(PREFIX)/include capi/tests/c/umap_random.c -L$(PREFIX)/lib -luffd_pager \
		-Wl,-rpath,$(PREFIX)/lib -o target/c/umap_random
	for t in 1 2; do for r in $$(seq $(UMAP_RUNS)); do \
		UMAP_BUFSIZE=16384 UMAP_PAGE_FILLERS=2 UMAP_PAGE_EVICTORS=2 \
			target/c/umap_random /dev/shm/uffd-umap-bench.dat 65536 $$t | grep random-read || exit 1; \
	done; done; rm -f /dev/shm/uffd-umap-bench.dat

# Seed 000's reproducer, unmodified, under the LD_PRELOAD shim: a budget
# stands in for the memory cgroup, a latency model for the disk. Prints the
# seed's table (rounds/s, Miss/Drop and the two counters) for both policies.
SEED_THREADS ?= 8
SEED_SECONDS ?= 10
SEED_BUDGET ?= 64M
SEED_LATENCY ?= fixed:50us
seed-preload: c-lib
	scripts/seed-preload.sh $(PREFIX)/lib/libuffd_pager_preload.so $(SEED_THREADS) $(SEED_SECONDS) $(SEED_BUDGET) $(SEED_LATENCY)
