"""The test suite: one folder per part of the repository (attention/, models/, swap/, engine/, analysis/, tools/,
demo/), shared helpers in helpers/. A package, so that pytest puts the repository first on sys.path and files
of the same name in two folders do not collide."""
