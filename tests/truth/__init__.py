"""The truth suite: planted weeks declared as data, each with the answer every output must
give (review JSON, Markdown, HTML, compare, policy, --fail-on), planted through the real
ingest and checked on SQLite and PostgreSQL."""
