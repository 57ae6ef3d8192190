"""Collection rules for the whole repository (pytest.ini's testpaths include the packages, for doctests)."""
import importlib.util

# rlds_tf.beam needs the optional Apache Beam extra (its tests and doctests run in the Beam venv that
# .ci/make_beam_venv.sh builds); without Beam its modules cannot be imported, so they are not collected.
collect_ignore_glob = [] if importlib.util.find_spec("apache_beam") else ["rlds_tf/beam/*"]
