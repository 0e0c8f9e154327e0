"""What the tests and the benchmarks both build on: checkpoints with tiny or random weights, the diffusers reference
forward, a farm run's inputs, a Ray cluster of several nodes on one machine. Tests and benchmarks import this
package, never each other (tests/test_import_graph.py); it is not part of the wheel.
"""
