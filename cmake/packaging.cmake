# Debian packages with CPack (`cpack -G DEB` in a build directory; scripts/lib/packages.sh):
#   idem-gateway   the gateway, its systemd unit, a default config (copied to /etc/idem once),
#                  a system user `idem` and /var/lib/idem (postinst)
#   idemctl        the CLI
#   idem-consume   the queue-consumer sidecar
#   idem-relay     the outbox relay
#   libidem-dev    headers, static libraries and the CMake package (find_package components)
# Runtime dependencies come from dpkg-shlibdeps.

install(FILES ${PROJECT_SOURCE_DIR}/packaging/idem-gateway.service
  DESTINATION lib/systemd/system COMPONENT gateway)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/gateway.toml DESTINATION ${CMAKE_INSTALL_DATADIR}/idem COMPONENT gateway)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/gateway.md ${PROJECT_SOURCE_DIR}/docs/operations.md
  DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/idem-gateway COMPONENT gateway)

set(CPACK_PACKAGE_NAME idem)
set(CPACK_PACKAGE_VENDOR "idem")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Idempotency for HTTP APIs and queue consumers")
set(CPACK_PACKAGE_CONTACT "idem developers <dev@idem.invalid>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://idem.invalid")
set(CPACK_COMPONENTS_ALL gateway idemctl consume relay dev)

set(CPACK_DEBIAN_GATEWAY_PACKAGE_NAME idem-gateway)
set(CPACK_COMPONENT_GATEWAY_DESCRIPTION "idem-gateway: Stripe-grade idempotency in front of any HTTP API")
set(CPACK_DEBIAN_GATEWAY_PACKAGE_DEPENDS "passwd")
set(CPACK_DEBIAN_GATEWAY_PACKAGE_CONTROL_EXTRA
  "${PROJECT_SOURCE_DIR}/packaging/gateway/postinst;${PROJECT_SOURCE_DIR}/packaging/gateway/prerm;${PROJECT_SOURCE_DIR}/packaging/gateway/postrm")
set(CPACK_DEBIAN_GATEWAY_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)

set(CPACK_DEBIAN_IDEMCTL_PACKAGE_NAME idemctl)
set(CPACK_COMPONENT_IDEMCTL_DESCRIPTION "idemctl: send requests with safe retries, operate idem stores and outboxes")
set(CPACK_DEBIAN_CONSUME_PACKAGE_NAME idem-consume)
set(CPACK_COMPONENT_CONSUME_DESCRIPTION "idem-consume: exactly-once effects for RabbitMQ and Redis Streams consumers")
set(CPACK_DEBIAN_RELAY_PACKAGE_NAME idem-relay)
set(CPACK_COMPONENT_RELAY_DESCRIPTION "idem-relay: publishes a transactional outbox to a broker or a webhook")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libidem-dev)
set(CPACK_COMPONENT_DEV_DESCRIPTION "libidem: the idempotency engine, stores, brokers and client (headers, static libraries, CMake package)")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# core and sqlite need only these; the other components' libraries are suggested.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libssl-dev, libsqlite3-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "libpq-dev, libhiredis-dev, libcurl4-openssl-dev, libboost-dev, librabbitmq-dev, librdkafka-dev, pkg-config")

include(CPack)
