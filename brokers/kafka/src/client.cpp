#include "client.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>

namespace idem::kafka_detail {
namespace {

bool is_secret_property(std::string_view name) { return name == "sasl.password" || name == "ssl.key.password"; }

bool is_refusal(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR__SSL ||
         err == RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED || err == RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM ||
         err == RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE || err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED;
}

void on_error(rd_kafka_t* rk, int code, const char* reason, void* opaque) {
  auto* events = static_cast<ClientEvents*>(opaque);
  if (events == nullptr) return;
  auto err = static_cast<rd_kafka_resp_err_t>(code);
  Failure f;
  f.where = events->where;
  f.user = events->user;
  f.detail = scrub(reason != nullptr ? reason : "", events->secrets);
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> buf{};
    err = rd_kafka_fatal_error(rk, buf.data(), buf.size());
    f.detail = scrub(buf.data(), events->secrets);
    f.fatal = true;
  }
  f.code = err;
  if (f.fatal) {
    events->fatal = f;
  } else if (is_refusal(err)) {
    events->refusal = f;
  } else if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
    events->outage = f;
    ++events->outages;
  }
  if (events->on_warning) events->on_warning(map_error(f).message);
}

// librdkafka logs to stderr unless told otherwise; what matters reaches error_cb too.
void silent_log(const rd_kafka_t*, int, const char*, const char*) {}

}  // namespace

std::vector<std::string> secrets_of(const KafkaUrl& url) {
  std::vector<std::string> out;
  for (const std::string* s : {&url.sasl_password, &url.ssl_key_password}) {
    if (!s->empty()) out.push_back(*s);
  }
  return out;
}

std::string scrub(std::string text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    if (secret.size() < 3) continue;  // replacing "ab" everywhere would garble the message
    for (auto pos = text.find(secret); pos != std::string::npos; pos = text.find(secret, pos + 3)) {
      text.replace(pos, secret.size(), "***");
    }
  }
  return text;
}

std::string default_client_name() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return std::string(host.data()) + "-" + std::to_string(::getpid());
}

BrokerResult<Done> set(rd_kafka_conf_t* conf, const std::string& name, const std::string& value, const std::string& where) {
  std::array<char, 512> errstr{};
  if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), errstr.data(), errstr.size()) == RD_KAFKA_CONF_OK) return Done{};
  std::string why = is_secret_property(name) ? std::string("(value not shown)") : std::string(errstr.data());
  return std::unexpected(BrokerError{BrokerErrc::invalid, where + ": librdkafka refused " + name + ": " + why, false});
}

BrokerResult<Conf> base_conf(const KafkaUrl& url, const std::string& client_id, Millis connect_timeout, Millis reconnect_min,
                             Millis reconnect_max, ClientEvents& events) {
  Conf conf(rd_kafka_conf_new());
  const std::string& where = events.where;
  const auto ms = [](Millis m) { return std::to_string(std::max<std::int64_t>(m.count(), 1)); };
  std::vector<std::pair<std::string, std::string>> props = {
      {"bootstrap.servers", url.bootstrap_servers()},
      {"client.id", client_id},
      {"security.protocol", url.security_protocol},
      // A TCP (and TLS) connection that takes longer than this is tried again.
      {"socket.connection.setup.timeout.ms", ms(std::max(connect_timeout, Millis{1000}))},
      {"reconnect.backoff.ms", ms(reconnect_min)},
      {"reconnect.backoff.max.ms", ms(std::max(reconnect_max, reconnect_min))},
      {"log.connection.close", "false"},
  };
  if (!url.sasl_mechanism.empty()) {
    props.emplace_back("sasl.mechanisms", url.sasl_mechanism);
    props.emplace_back("sasl.username", url.sasl_username);
    props.emplace_back("sasl.password", url.sasl_password);
  }
  if (!url.ssl_ca_location.empty()) props.emplace_back("ssl.ca.location", url.ssl_ca_location);
  if (!url.ssl_certificate_location.empty()) props.emplace_back("ssl.certificate.location", url.ssl_certificate_location);
  if (!url.ssl_key_location.empty()) props.emplace_back("ssl.key.location", url.ssl_key_location);
  if (!url.ssl_key_password.empty()) props.emplace_back("ssl.key.password", url.ssl_key_password);
  for (const auto& [name, value] : props) {
    if (auto ok = set(conf.get(), name, value, where); !ok) return std::unexpected(ok.error());
  }
  rd_kafka_conf_set_log_cb(conf.get(), silent_log);
  rd_kafka_conf_set_error_cb(conf.get(), on_error);
  rd_kafka_conf_set_opaque(conf.get(), &events);
  return conf;
}

BrokerResult<Handle> create(rd_kafka_type_t type, Conf conf, const std::string& where) {
  std::array<char, 512> errstr{};
  rd_kafka_t* rk = rd_kafka_new(type, conf.get(), errstr.data(), errstr.size());
  if (rk == nullptr) {
    // rd_kafka_new refuses inconsistent settings (a certificate it cannot read, say).
    return std::unexpected(BrokerError{BrokerErrc::invalid, where + ": librdkafka: " + std::string(errstr.data()), false});
  }
  (void)conf.release();  // rd_kafka_new owns it now
  return Handle(rk);
}

BrokerResult<Done> check_cluster(rd_kafka_t* rk, const std::string& topic, Millis timeout, ClientEvents& events,
                                 const std::function<void()>& serve, const std::string& doing) {
  rd_kafka_topic_t* rkt = topic.empty() ? nullptr : rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, static_cast<int>(std::max<std::int64_t>(timeout.count(), 1)));
  if (rkt != nullptr) rd_kafka_topic_destroy(rkt);
  if (serve) serve();  // error_cb tells why a cluster did not answer
  if (events.fatal) {
    if (md != nullptr) rd_kafka_metadata_destroy(md);
    return std::unexpected(map_error(*events.fatal));
  }
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    if (events.refusal) {  // a refused login or TLS handshake: an operator must act
      Failure f = *events.refusal;
      f.doing = doing;
      return std::unexpected(map_error(f));
    }
    Failure f;
    f.code = err;
    f.where = events.where;
    f.doing = doing;
    f.user = events.user;
    if (err == RD_KAFKA_RESP_ERR__TIMED_OUT || err == RD_KAFKA_RESP_ERR__TRANSPORT) {
      return std::unexpected(BrokerError{BrokerErrc::unavailable,
                                         events.where + ": " + doing + ": no Kafka broker answered within " +
                                             std::to_string(timeout.count()) + " ms (is the cluster up and reachable?)",
                                         false});
    }
    return std::unexpected(map_error(f));
  }
  events.refusal.reset();  // the cluster answers: an earlier refusal is over
  events.outage.reset();
  BrokerResult<Done> result = Done{};
  if (!topic.empty()) {
    bool found = false;
    for (int i = 0; i < md->topic_cnt; ++i) {
      const rd_kafka_metadata_topic_t& t = md->topics[i];
      if (topic != t.topic) continue;
      found = true;
      Failure f;
      f.where = events.where;
      f.doing = doing;
      f.topic = topic;
      f.user = events.user;
      if (t.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        f.code = t.err;
        result = std::unexpected(map_error(f));
      } else if (t.partition_cnt == 0) {
        f.code = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        result = std::unexpected(map_error(f));
      }
    }
    if (!found) {
      Failure f;
      f.code = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
      f.where = events.where;
      f.doing = doing;
      f.topic = topic;
      result = std::unexpected(map_error(f));
    }
  }
  rd_kafka_metadata_destroy(md);
  return result;
}

}  // namespace idem::kafka_detail
