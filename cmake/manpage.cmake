# Writes a command's manual page from its --help (NAME, SYNOPSIS, the help as DESCRIPTION), gzipped
# as Debian wants it (gzip -9n: no name or time stamp, so the page is the same on every build).
# usage: cmake -DPROGRAM=path -DNAME=ferryd -DSECTION=8 -DVERSION=0.2.0 -DOUT=ferryd.8.gz -P manpage.cmake
execute_process(COMMAND ${PROGRAM} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR help STREQUAL "")
  message(FATAL_ERROR "${PROGRAM} --help failed (${rc}): no manual page for ${NAME}")
endif()
set(summaries
  "ferryd=node-level GPU transfer daemon"
  "ferryctl=control and inspect ferryd, verify its signed records"
  "ferry-bench=benchmarks of copies through ferryd"
  "ferry-demo=copy random data through ferryd and check every byte")
set(summary "")
foreach(s ${summaries})
  if(s MATCHES "^${NAME}=(.*)$")
    set(summary "${CMAKE_MATCH_1}")
  endif()
endforeach()
if(summary STREQUAL "")
  message(FATAL_ERROR "manpage.cmake: no summary for ${NAME}")
endif()
# troff: a backslash is written \e; a line starting with . or ' would be a request.
string(REPLACE "\\" "\\e" help "${help}")
string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
string(REGEX REPLACE "\n+$" "" help "${help}")
string(REGEX MATCH "^[^\n]*" usage "${help}")
string(REGEX REPLACE "^usage: " "" usage "${usage}")
string(TOUPPER "${NAME}" title)
set(others ferryd.8 ferryctl.1 ferry-bench.1 ferry-demo.1)
list(REMOVE_ITEM others ${NAME}.${SECTION})
list(TRANSFORM others REPLACE "^(.*)\\.([0-9])$" ".BR \\1 (\\2)")
list(JOIN others ",\n" see_also)
string(REPLACE "-" "\\-" name_escaped "${NAME}")
file(WRITE ${OUT}.tmp ".TH ${title} ${SECTION} \"\" \"ferry ${VERSION}\" \"ferry\"
.SH NAME
${name_escaped} \\- ${summary}
.SH SYNOPSIS
.nf
${usage}
.fi
.SH DESCRIPTION
The text of
.B ${NAME} \\-\\-help:
.PP
.nf
${help}
.fi
.SH SEE ALSO
${see_also}
.PP
/usr/share/doc/ferry/README.md and the documentation in the ferry source tree (docs/).
")
execute_process(COMMAND gzip -9n -c ${OUT}.tmp OUTPUT_FILE ${OUT} RESULT_VARIABLE rc)
file(REMOVE ${OUT}.tmp)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gzip failed for ${OUT}")
endif()
