# Convenience aliases for the scripts (the scripts themselves need only bash).
.PHONY: build run test clean
build:
	bash scripts/build.sh
run:
	bash scripts/run.sh
test:
	bash scripts/test.sh
clean:
	rm -rf build out
