// Compiles the precompiled header (cmake/BridgeBuild.cmake) that every bridge target reuses; it has no code.
