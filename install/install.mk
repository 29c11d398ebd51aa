# install/install.mk - `make install` and the consumer tests (included by the top-level Makefile).
#   make install [PREFIX=/usr/local] [DESTDIR=]
#        PREFIX/include/entropyinfer.h; PREFIX/lib/libentropyinfer_cuda.so when `make cuda`
#        has built it; PREFIX/lib/pkgconfig/entropyinfer.pc; PREFIX/lib/cmake/entropyinfer/
#        entropyinferConfig.cmake and entropyinferConfigVersion.cmake (find_package(entropyinfer)
#        gives the INTERFACE target entropyinfer::entropyinfer). DESTDIR stages the tree
#        (packagers); the files name PREFIX, not DESTDIR.
#   make uninstall [PREFIX=...] [DESTDIR=]  removes exactly those files
#   make test-install  installs into build/install-test/prefix, then builds and runs two small
#        consumer projects against it: tests/install/cmake (find_package) and
#        tests/install/pkgconfig (pkg-config --cflags --libs); the consumer also checks that
#        the header finds the plugin by its name through the loader's search path and beside
#        the executable (../lib), with the fake plugin of test-plugin standing in for CUDA.
# PREFIX and DESTDIR keep their GNU names; this fragment's other variables start with INSTALL_.
PREFIX            ?= /usr/local
DESTDIR           ?=
INSTALL_BUILD     := $(or $(BUILD),build)
INSTALL_VERSION   := $(shell sed -n 's/^\#define EI_VERSION_STRING "\(.*\)"/\1/p' entropyinfer.h)
INSTALL_SUBST      = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(INSTALL_VERSION)|g' \
                         -e 's|@VERSION_MAJOR@|$(word 1,$(subst ., ,$(INSTALL_VERSION)))|g' \
                         -e 's|@VERSION_MINOR@|$(word 2,$(subst ., ,$(INSTALL_VERSION)))|g'
INSTALL_ROOT       = $(DESTDIR)$(PREFIX)
INSTALL_PLUGIN    := $(INSTALL_BUILD)/libentropyinfer_cuda.so
INSTALL_FILES      = include/entropyinfer.h lib/pkgconfig/entropyinfer.pc lib/cmake/entropyinfer/entropyinferConfig.cmake \
                     lib/cmake/entropyinfer/entropyinferConfigVersion.cmake lib/libentropyinfer_cuda.so

.PHONY: install uninstall test-install

install:
	@test -n "$(INSTALL_VERSION)" || { echo "install: no EI_VERSION_STRING in entropyinfer.h"; exit 1; }
	@case "$(PREFIX)" in /*) ;; *) echo "install: PREFIX must be an absolute path (got '$(PREFIX)')"; exit 1;; esac
	install -d $(INSTALL_ROOT)/include $(INSTALL_ROOT)/lib/pkgconfig $(INSTALL_ROOT)/lib/cmake/entropyinfer
	install -m 644 entropyinfer.h $(INSTALL_ROOT)/include/entropyinfer.h
	$(INSTALL_SUBST) install/entropyinfer.pc.in > $(INSTALL_ROOT)/lib/pkgconfig/entropyinfer.pc
	$(INSTALL_SUBST) install/entropyinferConfig.cmake.in > $(INSTALL_ROOT)/lib/cmake/entropyinfer/entropyinferConfig.cmake
	$(INSTALL_SUBST) install/entropyinferConfigVersion.cmake.in > $(INSTALL_ROOT)/lib/cmake/entropyinfer/entropyinferConfigVersion.cmake
	@if [ -f $(INSTALL_PLUGIN) ]; then install -m 755 $(INSTALL_PLUGIN) $(INSTALL_ROOT)/lib/libentropyinfer_cuda.so && \
	  echo "install: CUDA plugin $(INSTALL_ROOT)/lib/libentropyinfer_cuda.so"; \
	else echo "install: no $(INSTALL_PLUGIN) (run 'make cuda' first for the GPU backend): header only"; fi
	@echo "install: entropyinfer $(INSTALL_VERSION) in $(INSTALL_ROOT)"

uninstall:
	rm -f $(addprefix $(INSTALL_ROOT)/,$(INSTALL_FILES))
	-rmdir $(INSTALL_ROOT)/lib/cmake/entropyinfer 2>/dev/null

# The consumer tests: a fresh prefix each time, the projects built out of tree.
INSTALL_TEST      := $(INSTALL_BUILD)/install-test
INSTALL_TEST_PFX  := $(abspath $(INSTALL_TEST))/prefix
test-install: $(INSTALL_BUILD)/fake_cuda.so
	rm -rf $(INSTALL_TEST)
	$(MAKE) --no-print-directory install PREFIX=$(INSTALL_TEST_PFX) DESTDIR=
	cmake -S tests/install/cmake -B $(INSTALL_TEST)/cmake -DCMAKE_PREFIX_PATH=$(INSTALL_TEST_PFX) -DCMAKE_BUILD_TYPE=Release > $(INSTALL_TEST)/cmake.log 2>&1 || \
	  { cat $(INSTALL_TEST)/cmake.log; exit 1; }
	cmake --build $(INSTALL_TEST)/cmake > $(INSTALL_TEST)/cmake-build.log 2>&1 || { cat $(INSTALL_TEST)/cmake-build.log; exit 1; }
	$(INSTALL_TEST)/cmake/consumer_cmake
	$(MAKE) --no-print-directory -C tests/install/pkgconfig OUT=$(abspath $(INSTALL_TEST))/pkgconfig \
	  PKG_CONFIG_PATH=$(INSTALL_TEST_PFX)/lib/pkgconfig
	$(INSTALL_TEST)/pkgconfig/consumer_pkgconfig
	@# The plugin by name: the fake plugin as libentropyinfer_cuda.so on LD_LIBRARY_PATH, then
	@# beside the executable in an installed layout (bin/ and lib/), then nowhere (refused).
	mkdir -p $(INSTALL_TEST)/lookup/lib $(INSTALL_TEST)/lookup/bin $(INSTALL_TEST)/lookup/cwd
	cp $(INSTALL_BUILD)/fake_cuda.so $(INSTALL_TEST)/lookup/lib/libentropyinfer_cuda.so
	cp $(INSTALL_TEST)/pkgconfig/consumer_pkgconfig $(INSTALL_TEST)/lookup/bin/
	cp $(INSTALL_BUILD)/fake_cuda.so $(INSTALL_TEST)/lookup/cwd/libentropyinfer_cuda.so
	env -u EI_CUDA_LIBRARY LD_LIBRARY_PATH=$(abspath $(INSTALL_TEST))/lookup/lib $(INSTALL_TEST)/pkgconfig/consumer_pkgconfig --plugin found
	env -u EI_CUDA_LIBRARY -u LD_LIBRARY_PATH $(INSTALL_TEST)/lookup/bin/consumer_pkgconfig --plugin found
	cd $(INSTALL_TEST)/lookup/cwd && env -u EI_CUDA_LIBRARY -u LD_LIBRARY_PATH ../../pkgconfig/consumer_pkgconfig --plugin absent
	$(MAKE) --no-print-directory uninstall PREFIX=$(INSTALL_TEST_PFX) DESTDIR=
	@left=$$(find $(INSTALL_TEST_PFX) -type f | head -5); test -z "$$left" || { echo "uninstall left: $$left"; exit 1; }
	@echo "test-install: CMake and pkg-config consumers built against an installed copy and passed"
