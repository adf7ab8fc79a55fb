# Embeds compile/prologue.template.cc (with the cell ABI header pasted over its #include) into a
# C++ source as a string constant, so generated cells are self-contained. Run at build time.
file(READ ${ABI} abi)
file(READ ${PROLOGUE} prologue)
string(REPLACE "#include \"src/kiln/abi/cell_abi.h\"" "${abi}" text "${prologue}")
file(WRITE ${OUT} "// Generated from compile/prologue.template.cc by embed_prologue.cmake. Do not edit.\n")
file(APPEND ${OUT} "namespace kiln {\nextern const char kCellPrologue[];\nconst char kCellPrologue[] = R\"KILNPROLOGUE(${text})KILNPROLOGUE\";\n}  // namespace kiln\n")
