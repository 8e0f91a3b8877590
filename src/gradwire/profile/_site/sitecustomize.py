"""Loaded by Python at start-up when ``gradwire profile`` runs a job."""
try:
    from gradwire.profile.bootstrap import install

    install()
except Exception as exc:  # never break the user's interpreter
    import sys

    print(f"gradwire profile: could not install the profiler: {exc}", file=sys.stderr)
