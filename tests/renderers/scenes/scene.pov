// A small POV-Ray scene for Tessera's tests: hard edges, reflections, an include file.
#version 3.7;
#include "props.inc"
global_settings { assumed_gamma 1.0 }
camera { location <0, 2, -5> look_at <0, 0.6, 0> angle 50 }
light_source { <4, 6, -4> color rgb 1 }
light_source { <-5, 3, -2> color rgb 0.4 }
plane { y, 0 texture { Checker } }
sphere { <-0.8, 0.7, 0>, 0.7 texture { Chrome } }
box { <0.3, 0, -0.4>, <1.1, 0.8, 0.4> rotate y*25 pigment { rgb <0.2, 0.5, 0.9> } }
Pillar(1.6, 1.0)
Pillar(-2.0, 1.5)
