# Set-up is two commands on a fresh machine:  make demo  and  make test.

CARGO ?= cargo

.PHONY: demo test deps lint bench

# userfaultfd-sys generates its bindings with bindgen, which needs libclang.
deps:
	@if ! ldconfig -p | grep -q 'libclang[-.0-9]*\.so'; then \
		echo "installing libclang (needed by userfaultfd-sys/bindgen)"; \
		apt-get update -qq && apt-get install -y -qq libclang1-14 >/dev/null; \
	fi

demo: deps
	$(CARGO) run --release --quiet -- demo

test: deps
	$(CARGO) test --features fault-inject

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --features fault-inject -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --quiet

bench: deps
	$(CARGO) run --release --quiet -- bench fault-cost
