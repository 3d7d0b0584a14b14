"""Launch adapters: small programs that let an implementation which cannot take the launch contract's placeholders
(conformance/launch.py) be started by the harness anyway — they map ``{state_dir}``, ``{broker_url}``, the clock hook
and the rest onto the implementation's own configuration, describe where it really listens in ``{target_file}``, and
then exec it (so the harness's SIGKILL of the process group reaches it).

``python -m conformance.adapters.claudemesh`` is the first: the upstream TypeScript claudemesh daemon.
"""
