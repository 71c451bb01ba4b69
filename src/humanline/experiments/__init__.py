"""The experiments the command line ships, over one harness: `humanline demo` (`demo`: a tiny model on
a CPU, in minutes) and `humanline reproduce smollm2` (`reproduce`: SmolLM2-135M-Instruct);
`harness` holds what both use.
"""
