# The two commands README.md opens with, plus the slower checks docs/commands.md documents.
.PHONY: run test bench fuzz

run: ## Set up, build, and run the demo: the desk's window plus a scripted agent on the built-in tools.
	.ci/setup
	# The same build as the test command's (a -p build resolves other features and would rebuild).
	cargo build --locked --workspace
	./target/debug/countersign demo

test: ## Set up and run every test, as CI does.
	.ci/test

bench: ## Print the benchmark figures (core: mint, verify, 1 MiB plan hash; store: durable spend, and spends/s with verify+spend p50/p99 on SQLite and PostgreSQL side by side; pipe + desk: pass-through latency (median and p99, from a raw stdio client) vs direct, one and two bare relays and mcp-guardian when installed; the pipe's idle memory and start time; the desk's memory per agent; the desk's window: preflight → visible warm and after the idle release, memory open and released; the desk under 1,500 stalled connections and 2,000 unanswered preflights; the desk under 32 agents with real upstreams (every answer its caller's, latency, CPU, memory; then their open calls alone, calls/s, p50 and p99 beside the same agents connected straight to their upstreams) and 200 agents connecting and disconnecting for a minute (threads, descriptors, processes, memory before and after); countersign serve: open-call latency beside its upstream reached directly over HTTP and through a bare byte relay, ask-and-approve cycles and confirms per second across two replicas on PostgreSQL, memory idle and per agent; the approvers' page on a phone screen in Chromium: page load to the call shown and to a clickable Approve, decision round trip to the page and to the agent, p50/p95).
	cargo bench --locked -p countersign-core
	cargo bench --locked -p countersign-cedar --bench rules
	cargo bench --locked -p countersign-store --bench spend
	.ci/with-postgres cargo bench --locked -p countersign-store --features postgres --bench records
	cargo build --locked --release -p countersign
	cargo bench --locked -p countersign-tests --bench passthrough
	cargo build --locked -p countersign -p countersign-desk
	.ci/with-keychain xvfb-run -a -s "-screen 0 1280x800x24" cargo run --locked -q -p countersign-tests --example desk_bench
	.ci/with-keychain xvfb-run -a -s "-screen 0 1280x800x24" cargo run --locked -q -p countersign-tests --example flood_bench
	cargo build --locked -q -p countersign-tests --bin desk_child --example load_bench && ./target/debug/examples/load_bench
	cargo build --locked --release -q -p countersign-serve --bin countersign-serve && cargo build --locked --release -q -p countersign-tests --example serve_bench && .ci/with-postgres ./target/release/examples/serve_bench
	cargo build --locked -q -p countersign-serve -p countersign-tests --example page_bench && .ci/with-postgres ./target/debug/examples/page_bench

fuzz: ## Run each fuzz target for FUZZ_SECONDS (default 60).
	.ci/fuzz $${FUZZ_SECONDS:-60}
