# The two newcomer commands are `make run` and `make test`; both set up what they need first.
.PHONY: setup run test test-unit test-stack-down up down status lint bench clean

VENV := .venv
SR := $(VENV)/bin/streamrec

setup:
	@bash deploy/setup.sh

# The demo's stack reads the catalogue (attribute slots): new items are recommendable on arrival.
DEMO_ENV := STREAMREC_TRAINER__ATTR_TOKENS=$${STREAMREC_TRAINER__ATTR_TOKENS:-16}

run: setup
	@$(DEMO_ENV) $(SR) up
	@$(DEMO_ENV) $(SR) demo

# Tiers: the unit tests first (no services, a few minutes) and nothing else when one fails;
# then the integration, e2e and chaos tests on the real stack. Each prints its slowest tests.
test: setup
	$(VENV)/bin/pytest tests/unit --durations=10
	STREAMREC_TEST_STOP_STACK=1 $(VENV)/bin/pytest tests --ignore=tests/unit --durations=25

test-unit: setup
	$(VENV)/bin/pytest tests/unit

test-stack-down:
	@$(SR) down --run-dir .streamrec-test

up: setup
	@$(SR) up

down:
	@$(SR) down

status:
	@$(SR) status

# Lint: ruff, mypy (pydantic plugin) and the dependency ladder (tests/layering.py).
lint: setup
	$(VENV)/bin/ruff check streamrec stream model serving feature_store deploy tests bench
	$(VENV)/bin/mypy streamrec stream model serving feature_store deploy
	$(VENV)/bin/python -m tests.layering

clean: down
	rm -rf .streamrec .streamrec-test
