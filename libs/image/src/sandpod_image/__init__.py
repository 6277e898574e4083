"""Sandbox images: what a sandbox's root filesystem is made of.

Modules, bottom up: ``reference`` (image names), ``auth`` (registry credentials), ``registry``
(pulls and pushes over the distribution API), ``sources`` (OCI layout directories and
``docker save`` tarballs), ``layers`` (a layer tarball unpacked safely into an overlay-ready
directory, and back), ``store`` (the content-addressed blob and layer store every sandbox of a
node shares, with garbage collection), ``debian`` (the default root filesystem), ``build``
(template build steps and their cache). Nothing here speaks NATS: the services wire it in.
"""
